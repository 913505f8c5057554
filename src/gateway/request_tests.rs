use serde_json::{Value as Json, json};

use super::*;

const SCHEMA: Schema = &[
    ("s", Kind::Scalar),
    ("t", Kind::Tokens),
    ("h", Kind::Hashes),
    ("p", Kind::Pairs),
];

fn seed(max_tokens: usize) -> RootSeed {
    RootSeed {
        schema: SCHEMA,
        limits: Limits { max_tokens },
    }
}

/// Decode `doc` as JSON and as msgpack; both must agree. Returns the fields' debug text.
fn both(doc: &Json, max: usize) -> Result<String, OpError> {
    let json = from_json(&serde_json::to_vec(doc).unwrap(), seed(max));
    let msgpack = from_msgpack(&rmp_serde::to_vec_named(doc).unwrap(), seed(max));
    let show = |r: Result<Fields, OpError>| r.map(|f| format!("{f:?}"));
    let (json, msgpack) = (show(json), show(msgpack));
    match (&json, &msgpack) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "{doc}"),
        (Err(a), Err(b)) => assert_eq!((&a.field, a.reason), (&b.field, b.reason), "{doc}"),
        _ => panic!("{doc}: JSON {json:?}, msgpack {msgpack:?}"),
    }
    json
}

fn field(doc: Json, max: usize, key: &str) -> Val {
    let bytes = rmp_serde::to_vec_named(&doc).unwrap();
    both(&doc, max).expect("decodes");
    let mut f = from_msgpack(&bytes, seed(max)).unwrap();
    f.take(key).expect("field present")
}

fn invalid(v: Val) -> (String, &'static str, String) {
    match v {
        Val::Invalid(e) => (e.field.unwrap_or_default(), e.reason, e.message),
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn scalars_keep_their_value_and_containers_only_their_type() {
    let cases = [
        (json!("x"), Val::Str("x".into())),
        (json!(-3), Val::Int(-3)),
        (json!(u64::MAX), Val::Int(u64::MAX as i128)),
        (json!(0.5), Val::Float(0.5)),
        (json!(true), Val::Bool(true)),
        (json!(null), Val::Null),
        (json!([1, [2]]), Val::Other("array")),
        (json!({"k": [1]}), Val::Other("map")),
    ];
    for (value, expected) in cases {
        assert_eq!(field(json!({ "s": value }), 8, "s"), expected);
    }
    let bin = [&[0x81, 0xa1, b's', 0xc4, 2][..], &[1, 2]].concat();
    let mut f = from_msgpack(&bin, seed(8)).unwrap();
    assert_eq!(f.take("s"), Some(Val::Other("binary")));
}

#[test]
fn the_first_unknown_key_in_document_order_is_the_error_then_a_repeated_key() {
    let body = br#"{"s": 1, "zz": [1, 2, {"a": 3}], "aa": 2, "s": 2}"#;
    let e = from_json(body, seed(8)).unwrap_err();
    assert_eq!(
        (e.field.as_deref(), e.reason),
        (Some("zz"), "unknown_field")
    );
    assert_eq!(e.message, "unsupported request field: zz");
    // A key given twice is refused (whichever copy a reader would keep), in both encodings;
    // an unknown key is reported first.
    for body in [
        &br#"{"s": 1, "s": "two"}"#[..],
        br#"{"t": [1], "s": 1, "t": 2}"#,
    ] {
        let e = from_json(body, seed(8)).unwrap_err();
        assert_eq!(e.reason, "duplicate_field");
    }
    let e = from_json(br#"{"s": 1, "s": "two"}"#, seed(8)).unwrap_err();
    assert_eq!(
        (e.field.as_deref(), e.reason, e.message.as_str()),
        (Some("s"), "duplicate_field", "s is given more than once")
    );
    let twice = [0x82, 0xa1, b's', 0x01, 0xa1, b's', 0x02];
    let e = from_msgpack(&twice, seed(8)).unwrap_err();
    assert_eq!(
        (e.field.as_deref(), e.reason),
        (Some("s"), "duplicate_field")
    );
    let e = from_json(br#"{"s": 1, "s": 2, "zz": 3}"#, seed(8)).unwrap_err();
    assert_eq!(e.reason, "unknown_field");
}

#[test]
fn syntax_errors_come_first_then_not_a_map_then_unknown_keys() {
    let e = from_json(br#"{"bogus": 1, "s": }"#, seed(8)).unwrap_err();
    assert_eq!(e.reason, "invalid_json");
    assert!(e.message.starts_with("Invalid JSON: "), "{}", e.message);
    let e = from_json(b"[1, 2]", seed(8)).unwrap_err();
    assert_eq!(e.message, "request body must be a JSON object");
    let e = from_json(br#"{"a": 1} x"#, seed(8)).unwrap_err();
    assert_eq!(e.reason, "invalid_json");
    // An unknown key, then bytes that are not msgpack: the syntax error wins.
    let e = from_msgpack(&[0x82, 0xa1, b'z', 0x01, 0xa1, b's', 0xc1], seed(8)).unwrap_err();
    assert_eq!(e.reason, "invalid_msgpack");
    let e = from_msgpack(&[0x92, 0x01, 0x02], seed(8)).unwrap_err();
    assert_eq!(e.message, "request body must be a msgpack map");
    let e = from_msgpack(&[0x80, 0x80], seed(8)).unwrap_err();
    // The reference's two texts: anything undecodable, and a key that is not a string.
    assert_eq!(e.message, "Invalid msgpack object");
    let e = from_msgpack(&[0x81, 0x01, 0x01], seed(8)).unwrap_err();
    assert_eq!(e.message, "map keys must be strings");
}

#[test]
fn tokens_decode_from_arrays_and_little_endian_bins() {
    let t = field(json!({"t": [1, -2, i32::MAX, i32::MIN]}), 8, "t");
    assert_eq!(t, Val::Tokens(vec![1, -2, i32::MAX, i32::MIN]));
    let bin = [
        &[0x81, 0xa1, b't', 0xc4, 8][..],
        &7i32.to_le_bytes(),
        &(-1i32).to_le_bytes(),
    ];
    let mut f = from_msgpack(&bin.concat(), seed(8)).unwrap();
    assert_eq!(f.take("t"), Some(Val::Tokens(vec![7, -1])));
    let bad_bin = [&[0x81, 0xa1, b't', 0xc4, 3][..], &[1, 2, 3]].concat();
    let mut f = from_msgpack(&bad_bin, seed(8)).unwrap();
    let (_, reason, message) = invalid(f.take("t").unwrap());
    assert_eq!(
        (reason, message.as_str()),
        ("invalid_value", "t bin size must be a multiple of 4")
    );
    assert_eq!(field(json!({"t": []}), 8, "t"), Val::Tokens(vec![]));
}

#[test]
fn token_errors_name_the_first_bad_element() {
    let cases = [
        (
            json!([1, 2147483648i64, "x"]),
            "out_of_range",
            "t element is outside the int32 range",
            Some(1),
        ),
        (
            json!([1, 2, "3"]),
            "invalid_type",
            "t element must be an integer",
            Some(2),
        ),
        (
            json!([[1], 2]),
            "invalid_type",
            "t element must be an integer",
            Some(0),
        ),
        (
            json!([0.5]),
            "invalid_type",
            "t element must be an integer",
            Some(0),
        ),
        (
            json!("1 2 3"),
            "invalid_type",
            "t must be a bin or an array",
            None,
        ),
        (
            json!({"0": 1}),
            "invalid_type",
            "t must be a bin or an array",
            None,
        ),
        (
            json!(null),
            "invalid_type",
            "t must be a bin or an array",
            None,
        ),
    ];
    for (value, reason, message, index) in cases {
        let Val::Invalid(e) = field(json!({ "t": value }), 8, "t") else {
            panic!("{value}: expected an error");
        };
        let got = (e.field.as_deref(), e.reason, e.message.as_str(), e.index);
        assert_eq!(got, (Some("t"), reason, message, index), "{value}");
    }
}

#[test]
fn more_tokens_than_the_limit_are_refused_naming_the_field_and_the_setting() {
    assert_eq!(
        field(json!({"t": [1, 2, 3]}), 3, "t"),
        Val::Tokens(vec![1, 2, 3])
    );
    let got = invalid(field(json!({"t": [1, 2, 3, 4]}), 3, "t"));
    let message = "t has 4 elements; at most 3 are accepted (max_query_tokens)";
    assert_eq!(got, ("t".into(), "too_large", message.into()));
    // The count is reported before a bad element, in both encodings.
    let got = invalid(field(json!({"t": [1, "x", 3, 4]}), 3, "t"));
    assert_eq!(got.1, "too_large");
    let bin = [&[0x81, 0xa1, b't', 0xc4, 16][..], &[0; 16]].concat();
    let mut f = from_msgpack(&bin, seed(3)).unwrap();
    assert_eq!(invalid(f.take("t").unwrap()).1, "too_large");
    let got = invalid(field(json!({"h": [1, 2, 3, 4]}), 3, "h"));
    assert_eq!((got.0.as_str(), got.1), ("h", "too_large"));
}

#[test]
fn a_lying_array_length_is_a_syntax_error_and_allocates_nothing_for_it() {
    // Claims 2^32-1 elements, carries two.
    let body = [
        &[0x81, 0xa1, b't', 0xdd, 0xff, 0xff, 0xff, 0xff][..],
        &[1, 2],
    ]
    .concat();
    for max in [3, usize::MAX] {
        let e = from_msgpack(&body, seed(max)).unwrap_err();
        assert_eq!(e.reason, "invalid_msgpack");
    }
}

#[test]
fn hashes_keep_64_bits_signed_or_unsigned() {
    let h = field(json!({"h": [0, -1, i64::MIN, u64::MAX]}), 8, "h");
    assert_eq!(h, Val::Hashes(vec![0, u64::MAX, 1 << 63, u64::MAX]));
    let Val::Invalid(e) = field(json!({"h": [1, 0.5]}), 8, "h") else {
        panic!("expected an error");
    };
    let got = (e.message.as_str(), e.index);
    assert_eq!(got, ("h element must be a 64-bit integer", Some(1)));
    let bin = [&[0x81, 0xa1, b'h', 0xc4, 8][..], &[0; 8]].concat();
    let mut f = from_msgpack(&bin, seed(8)).unwrap();
    assert_eq!(invalid(f.take("h").unwrap()).2, "h must be an array");
}

#[test]
fn pairs_keep_the_first_five_in_order_and_mark_values_that_are_not_strings() {
    let doc = json!({"p": {"a": "1", "b": "2", "c": "3", "d": "4", "e": "5", "f": "6"}});
    let Val::Pairs(pairs) = field(doc, 8, "p") else {
        panic!("pairs expected");
    };
    let keys: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["a", "b", "c", "d", "e"]);
    assert_eq!(pairs.len(), PAIRS_KEPT);
    // A value that is not a string is kept as `None` for the registration checks to report
    // in their order; past the kept pairs values are only read.
    let doc = json!({"p": {"a": 1, "b": "2", "c": "3", "d": "4", "e": "5", "f": 6, "g": []}});
    let Val::Pairs(pairs) = field(doc, 8, "p") else {
        panic!("pairs expected");
    };
    assert_eq!(pairs[0], ("a".to_owned(), None));
    assert_eq!(pairs[1], ("b".to_owned(), Some("2".to_owned())));
    assert_eq!(pairs.len(), PAIRS_KEPT);
    let got = invalid(field(json!({"p": ["a"]}), 8, "p"));
    assert_eq!(got, ("p".into(), "invalid_type", "p must be a map".into()));
}

#[test]
fn a_parsed_config_object_decodes_like_a_body() {
    let Json::Object(map) = json!({"s": "x", "t": [1]}) else {
        unreachable!()
    };
    let mut f = from_json_map(map, seed(8)).unwrap();
    assert_eq!(f.take("t"), Some(Val::Tokens(vec![1])));
    let Json::Object(map) = json!({"nope": 1}) else {
        unreachable!()
    };
    assert_eq!(
        from_json_map(map, seed(8)).unwrap_err().reason,
        "unknown_field"
    );
}

//! Conversions between Python objects and the generated protobuf messages.
//!
//! Result shapes follow `docs/python-api.md`: rank keys stay decimal strings, counts are ints, and a
//! failed call yields the documented empty shape (`hits == {}`, `contexts == []`, ...).

use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

use crate::pb;

/// Token ids as int32, or `Ok(None)` when one is not representable as a signed 32-bit integer
/// (the caller answers INVALID_PARAMS, like for any other invalid request value).
///
/// Lists and tuples of exact ints are read through the C API (about 3 ns per token, so a 2k-token
/// prompt costs microseconds); anything else, such as array.array, numpy arrays or int subclasses,
/// takes the generic path.
pub fn token_ids(obj: &Bound<'_, PyAny>) -> PyResult<Option<Vec<i32>>> {
    if obj.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(
            "token_ids must be a list of int, not str",
        ));
    }
    let fast = if let Ok(list) = obj.cast::<PyList>() {
        exact_ints(list.len(), |i| unsafe {
            // SAFETY: `i < len` of a list we hold a reference to; nothing runs Python code between
            // the borrow and its use (exact ints convert without calling back), so the list
            // cannot shrink underneath us.
            ffi::PyList_GetItem(list.as_ptr(), i as ffi::Py_ssize_t)
        })
    } else if let Ok(tuple) = obj.cast::<PyTuple>() {
        exact_ints(tuple.len(), |i| unsafe {
            // SAFETY: as above; tuples are immutable besides.
            ffi::PyTuple_GetItem(tuple.as_ptr(), i as ffi::Py_ssize_t)
        })
    } else {
        None
    };
    if let Some(done) = fast {
        return Ok(done);
    }
    let mut out = Vec::with_capacity(obj.len().unwrap_or(0));
    for item in obj.try_iter()? {
        match token(&item?)? {
            Some(t) => out.push(t),
            None => return Ok(None),
        }
    }
    Ok(Some(out))
}

/// The fast path: `Some(result)` when every item is an exact `int`, `None` to fall back to the
/// generic path (which also produces the right error for a wrong item type).
fn exact_ints(len: usize, item: impl Fn(usize) -> *mut ffi::PyObject) -> Option<Option<Vec<i32>>> {
    let mut out = Vec::with_capacity(len);
    for i in 0..len {
        let obj = item(i);
        // SAFETY: `obj` is a valid borrowed reference (see the callers); the GIL is held.
        unsafe {
            if obj.is_null() || ffi::PyLong_CheckExact(obj) == 0 {
                ffi::PyErr_Clear();
                return None;
            }
            let v = ffi::PyLong_AsLong(obj);
            if v == -1 && !ffi::PyErr_Occurred().is_null() {
                // Beyond the C long range: certainly not an int32.
                ffi::PyErr_Clear();
                return Some(None);
            }
            match i32::try_from(v) {
                Ok(t) => out.push(t),
                Err(_) => return Some(None),
            }
        }
    }
    Some(Some(out))
}

fn token(item: &Bound<'_, PyAny>) -> PyResult<Option<i32>> {
    match item.extract::<i32>() {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.is_instance_of::<PyOverflowError>(item.py()) => Ok(None),
        Err(_) => Err(PyTypeError::new_err(format!(
            "token_ids must contain ints, got {}",
            item.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))),
    }
}

/// Which optional entries a query's result carries, as the call asked for them.
#[derive(Clone, Copy)]
pub struct Extras {
    /// `include_load`: the `loads` entry.
    pub load: bool,
    /// `include_status`: the `status` entry.
    pub status: bool,
}

pub fn query_result<'py>(
    py: Python<'py>,
    ret: i32,
    hits: Option<pb::QueryResponse>,
    extras: Extras,
) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("ret", ret)?;
    let (hits, loads, status) = match hits {
        Some(r) => (r.hits, r.loads, r.status),
        None => Default::default(),
    };
    if extras.load {
        out.set_item("loads", loads_dict(py, loads)?)?;
    }
    if extras.status {
        out.set_item("status", status_dict(py, status)?)?;
    }
    let hits_dict = PyDict::new(py);
    for (instance, h) in hits {
        let entry = PyDict::new(py);
        entry.set_item("longest_matched", h.longest_matched)?;
        let dp = PyDict::new(py);
        for (rank, device) in h.dp {
            dp.set_item(rank, device)?;
        }
        entry.set_item("dp", dp)?;
        let ranks = PyDict::new(py);
        for (rank, t) in h.rank_matches {
            let tiers = PyDict::new(py);
            tiers.set_item("device", t.device)?;
            tiers.set_item("cpu_local", t.cpu_local)?;
            tiers.set_item("cpu_share", t.cpu_share)?;
            tiers.set_item("disk", t.disk)?;
            ranks.set_item(rank, tiers)?;
        }
        entry.set_item("rank_matches", ranks)?;
        entry.set_item("device", h.device)?;
        entry.set_item("cpu_local", h.cpu_local)?;
        entry.set_item("cpu_share", h.cpu_share)?;
        entry.set_item("disk", h.disk)?;
        hits_dict.set_item(instance, entry)?;
    }
    out.set_item("hits", hits_dict)?;
    Ok(out)
}

/// The resolved profile always carries all five keys (empty strings if the server sent none).
fn hash_profile<'py>(py: Python<'py>, p: Option<pb::HashProfile>) -> PyResult<Bound<'py, PyDict>> {
    let p = p.unwrap_or_default();
    let out = PyDict::new(py);
    out.set_item("strategy", p.strategy)?;
    out.set_item("algorithm", p.algorithm)?;
    out.set_item("python_hash_seed", p.python_hash_seed)?;
    out.set_item("root_digest", p.root_digest)?;
    out.set_item("index_projection", p.index_projection)?;
    Ok(out)
}

pub fn global_view<'py>(
    py: Python<'py>,
    ret: i32,
    view: Option<pb::GetGlobalViewResponse>,
) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("ret", ret)?;
    let view = view.unwrap_or_default();
    out.set_item("context_count", view.context_count)?;
    let contexts = PyList::empty(py);
    for c in view.contexts {
        let ctx = PyDict::new(py);
        ctx.set_item("model_name", c.model_name)?;
        ctx.set_item("lora_name", c.lora_name)?;
        ctx.set_item("block_size", c.block_size)?;
        ctx.set_item("tenant_id", c.tenant_id)?;
        ctx.set_item("prefix_count", c.prefix_count)?;
        ctx.set_item("hash_profile", hash_profile(py, c.hash_profile)?)?;
        let instances = PyDict::new(py);
        for (id, ranks) in c.instances {
            instances.set_item(id, pyo3::types::PySet::new(py, ranks.ranks)?)?;
        }
        ctx.set_item("instances", instances)?;
        contexts.append(ctx)?;
    }
    out.set_item("contexts", contexts)?;
    Ok(out)
}

pub fn services<'py>(
    py: Python<'py>,
    ret: i32,
    list: Option<pb::ListServicesResponse>,
) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("ret", ret)?;
    let list = list.unwrap_or_default();
    out.set_item("count", list.count)?;
    let services = PyList::empty(py);
    for s in list.services {
        let svc = PyDict::new(py);
        svc.set_item("Endpoint", s.endpoint)?;
        svc.set_item("ReplayEndpoint", s.replay_endpoint)?;
        svc.set_item("Type", s.publisher_type)?;
        svc.set_item("ModelName", s.model_name)?;
        svc.set_item("LoraName", s.lora_name)?;
        svc.set_item("TenantID", s.tenant_id)?;
        svc.set_item("InstanceID", s.instance_id)?;
        svc.set_item("BlockSize", s.block_size)?;
        svc.set_item("DPRank", s.dp_rank)?;
        svc.set_item("CacheGroup", s.cache_group)?;
        svc.set_item("HashProfile", hash_profile(py, s.hash_profile)?)?;
        services.append(svc)?;
    }
    out.set_item("services", services)?;
    Ok(out)
}

/// `register_engine()`'s answer: {"ret", "instance_id", "model_name", "ranks"}.
pub fn engine<'py>(
    py: Python<'py>,
    ret: i32,
    reply: Option<pb::RegisterEngineResponse>,
) -> PyResult<Bound<'py, PyDict>> {
    let reply = reply.filter(|_| ret == 0).unwrap_or_default();
    let out = PyDict::new(py);
    out.set_item("ret", ret)?;
    out.set_item("instance_id", reply.instance_id)?;
    out.set_item("model_name", reply.model_name)?;
    let ranks = PyList::empty(py);
    for r in reply.ranks {
        let rank = PyDict::new(py);
        rank.set_item("dp_rank", r.dp_rank)?;
        rank.set_item("endpoint", r.endpoint)?;
        rank.set_item("replay_endpoint", r.replay_endpoint)?;
        rank.set_item("topic", r.topic)?;
        rank.set_item("block_size", r.block_size)?;
        ranks.append(rank)?;
    }
    out.set_item("ranks", ranks)?;
    Ok(out)
}

/// `query(include_load=True)`'s `loads`: instance id -> {"age_ms", "server_load"?, "ranks"}.
fn loads_dict<'py>(
    py: Python<'py>,
    loads: std::collections::HashMap<String, pb::InstanceLoad>,
) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    for (instance, l) in loads {
        let entry = PyDict::new(py);
        entry.set_item("age_ms", l.age_ms)?;
        if let Some(n) = l.server_load {
            entry.set_item("server_load", n)?;
        }
        let ranks = PyDict::new(py);
        for (rank, r) in l.ranks {
            let load = PyDict::new(py);
            load.set_item("num_running_reqs", r.num_running_reqs)?;
            load.set_item("num_waiting_reqs", r.num_waiting_reqs)?;
            load.set_item("token_usage", r.token_usage)?;
            ranks.set_item(rank, load)?;
        }
        entry.set_item("ranks", ranks)?;
        out.set_item(instance, entry)?;
    }
    Ok(out)
}

/// `query(include_status=True)`'s `status`: instance id -> {"status", "reason", "ranks"}, each
/// rank {"status", "reason", "state", "lag_ms", "groups"}, as the HTTP answer's `status`.
fn status_dict<'py>(
    py: Python<'py>,
    status: std::collections::HashMap<String, pb::InstanceStatus>,
) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    for (instance, s) in status {
        let entry = PyDict::new(py);
        entry.set_item("status", s.status)?;
        entry.set_item("reason", s.reason)?;
        let ranks = PyDict::new(py);
        for (rank, r) in s.ranks {
            let rank_entry = PyDict::new(py);
            rank_entry.set_item("status", r.status)?;
            rank_entry.set_item("reason", r.reason)?;
            rank_entry.set_item("state", r.state)?;
            rank_entry.set_item("lag_ms", r.lag_ms)?;
            let groups = PyList::empty(py);
            for g in r.groups {
                let group = PyDict::new(py);
                group.set_item("group", g.group)?;
                group.set_item("kind", g.kind)?;
                group.set_item("sliding_window", g.sliding_window)?;
                groups.append(group)?;
            }
            rank_entry.set_item("groups", groups)?;
            ranks.set_item(rank, rank_entry)?;
        }
        entry.set_item("ranks", ranks)?;
        out.set_item(instance, entry)?;
    }
    Ok(out)
}

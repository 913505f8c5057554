//! The figures of a run: one row per figure with our value and each Dynamo indexer's, the best
//! Dynamo indexer for that row and our ratio to it; printed as a table and, with `--json`,
//! written as one JSON document for scripts that draw from it.

use std::fmt::Write;

use crate::indexers::Kind;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    Lower,
    Higher,
}

pub struct Row {
    pub name: String,
    pub better: Better,
    pub ours: f64,
    /// Per [`Kind::ALL`]; `None` where the figure does not apply.
    pub dynamo: [Option<f64>; 3],
    decimals: usize,
}

impl Row {
    /// The best Dynamo indexer for this row and its value.
    pub fn best(&self) -> Option<(Kind, f64)> {
        Kind::ALL
            .into_iter()
            .zip(self.dynamo)
            .filter_map(|(k, v)| Some((k, v.filter(|v| v.is_finite())?)))
            .reduce(|a, b| {
                let b_wins = match self.better {
                    Better::Lower => b.1 < a.1,
                    Better::Higher => b.1 > a.1,
                };
                if b_wins { b } else { a }
            })
    }

    /// Ours divided by the best Dynamo indexer's value.
    pub fn ratio(&self) -> Option<f64> {
        self.best().map(|(_, v)| self.ours / v)
    }
}

pub struct Report {
    pub mode: String,
    pub rows: Vec<Row>,
    /// Free-form facts of the run (workload size, durations), also written to the JSON.
    pub notes: Vec<(String, String)>,
}

const NAME_WIDTH: usize = 74;

impl Report {
    pub fn new(mode: &str) -> Self {
        Report {
            mode: mode.to_string(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    pub fn note(&mut self, key: &str, value: impl ToString) {
        self.notes.push((key.to_string(), value.to_string()));
    }

    pub fn row(
        &mut self,
        name: &str,
        better: Better,
        decimals: usize,
        ours: f64,
        dynamo: [f64; 3],
    ) {
        self.row_opt(name, better, decimals, ours, dynamo.map(Some));
    }

    pub fn row_opt(
        &mut self,
        name: &str,
        better: Better,
        decimals: usize,
        ours: f64,
        dynamo: [Option<f64>; 3],
    ) {
        self.rows.push(Row {
            name: name.to_string(),
            better,
            ours,
            dynamo,
            decimals,
        });
    }

    pub fn print(&self) {
        println!();
        for k in Kind::ALL {
            println!("  {:<11} {}", k.name(), k.describe());
        }
        println!("  ratio: ours / the best Dynamo indexer of the row");
        println!();
        print!("{:<NAME_WIDTH$} {:>10}", "figure", "ours");
        for k in Kind::ALL {
            print!(" {:>10}", k.name());
        }
        println!(" {:>11} {:>9}", "best", "ours/best");
        for r in &self.rows {
            let d = r.decimals;
            print!("{:<NAME_WIDTH$} {:>10.d$}", r.name, r.ours);
            for v in r.dynamo {
                match v {
                    Some(v) => print!(" {v:>10.d$}"),
                    None => print!(" {:>10}", "-"),
                }
            }
            match (r.best(), r.ratio()) {
                (Some((k, _)), Some(ratio)) => println!(" {:>11} {ratio:>9.2}", k.name()),
                _ => println!(" {:>11} {:>9}", "-", "-"),
            }
        }
    }

    pub fn to_json(&self) -> String {
        let mut o = String::new();
        let _ = write!(
            o,
            "{{\n  \"mode\": {},\n  \"indexers\": {{",
            string(&self.mode)
        );
        for (i, k) in Kind::ALL.into_iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let _ = write!(
                o,
                "{sep}\n    {}: {}",
                string(k.name()),
                string(k.describe())
            );
        }
        o += "\n  },\n  \"notes\": {";
        for (i, (k, v)) in self.notes.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let _ = write!(o, "{sep}\n    {}: {}", string(k), string(v));
        }
        o += "\n  },\n  \"rows\": [";
        for (i, r) in self.rows.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let better = match r.better {
                Better::Lower => "lower",
                Better::Higher => "higher",
            };
            let _ = write!(
                o,
                "{sep}\n    {{\"name\": {}, \"better\": \"{better}\", \"ours\": {}, \"dynamo\": {{",
                string(&r.name),
                number(Some(r.ours))
            );
            for (j, (k, v)) in Kind::ALL.into_iter().zip(r.dynamo).enumerate() {
                let sep = if j == 0 { "" } else { ", " };
                let _ = write!(o, "{sep}{}: {}", string(k.name()), number(v));
            }
            let best = r
                .best()
                .map_or("null".to_string(), |(k, _)| string(k.name()));
            let _ = write!(
                o,
                "}}, \"best\": {best}, \"ratio\": {}}}",
                number(r.ratio())
            );
        }
        o += "\n  ]\n}\n";
        o
    }

    pub fn write_json(&self, path: &str) -> Result<(), String> {
        std::fs::write(path, self.to_json()).map_err(|e| format!("cannot write {path}: {e}"))
    }
}

fn string(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o += "\\\"",
            '\\' => o += "\\\\",
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn number(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v}"),
        _ => "null".to_string(),
    }
}

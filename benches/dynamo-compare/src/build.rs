//! Building each index from the workload: inputs prepared untimed, then applied by one writer
//! (ours) or sent to the indexer's event threads until they have applied the last one (Dynamo).

use std::time::{Duration, Instant};

use dynamo_kv_router::protocols::RouterEvent;

use crate::dynamo;
use crate::indexers::DynamoIndex;
use crate::measure::process_cpu_secs;
use crate::ours::{self, Ours};
use crate::workload::{PublisherBatch, Workload};

/// Wall time and CPU time of every thread of the process, over one build.
#[derive(Debug, Clone, Copy)]
pub struct Applied {
    pub wall: Duration,
    pub cpu: f64,
}

/// Our batches of the whole workload.
pub fn ours_batches(ours: &Ours, w: &Workload) -> Vec<ours::Batch> {
    ours_messages(ours, w, &w.batches)
}

/// Our batches of `messages` over the workload's prompts.
pub fn ours_messages(ours: &Ours, w: &Workload, messages: &[PublisherBatch]) -> Vec<ours::Batch> {
    let prompts: Vec<ours::PromptKeys> = w.prompts.iter().map(|p| ours.prompt(&p.tokens)).collect();
    messages.iter().map(|b| ours.batch(b, &prompts)).collect()
}

/// Dynamo's events of the whole workload, in publication order.
pub fn dynamo_events(w: &Workload) -> Vec<RouterEvent> {
    dynamo_messages(w, &w.batches)
        .into_iter()
        .flatten()
        .collect()
}

/// Dynamo's events of each of `messages` over the workload's prompts.
pub fn dynamo_messages(w: &Workload, messages: &[PublisherBatch]) -> Vec<Vec<RouterEvent>> {
    let prompts: Vec<dynamo::PromptKeys> = w
        .prompts
        .iter()
        .map(|p| dynamo::prompt(&p.tokens))
        .collect();
    let mut builder = dynamo::EventBuilder::new(w.holders());
    messages
        .iter()
        .map(|b| builder.events(b, &prompts))
        .collect()
}

pub fn apply_ours(ours: &mut Ours, batches: &[ours::Batch]) -> Applied {
    let (t, cpu) = (Instant::now(), process_cpu_secs());
    for b in batches {
        ours.apply(b);
    }
    Applied {
        wall: t.elapsed(),
        cpu: process_cpu_secs() - cpu,
    }
}

/// Sends every event (the queues are unbounded, as the router's), then waits until all are
/// applied: the time includes the channel hand-off.
pub fn apply_dynamo(index: &DynamoIndex, events: Vec<RouterEvent>) -> Applied {
    let (t, cpu) = (Instant::now(), process_cpu_secs());
    for ev in events {
        index.send(ev);
    }
    index.flush();
    Applied {
        wall: t.elapsed(),
        cpu: process_cpu_secs() - cpu,
    }
}

//! One trace replay through the service at one speed: the service in-process, one PUB socket per
//! simulated engine, the requests issued at their trace arrival times divided by the speed, a
//! KV-aware router asking over gRPC (the lean client) before each request, and a monitor that
//! times when each published batch is applied.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use mooncake_conductor::gateway::pb;
use prost::Message;
use tokio_util::sync::CancellationToken;

use crate::client::{HttpConn, grpc, register, status};
use crate::lean_grpc::{LeanGrpc, QUERY, framed};
use crate::publish::{Publisher, batch, handshake, removed, stored};
use crate::service::InProcess;
use crate::trace_sim::fleet::{Event, EventCounts, Fleet, HitRate, Policy, Router};
use crate::trace_sim::{BLOCK_SIZE, Prompt, Prompts, Request};

pub(crate) const MODEL: &str = "trace-model";

/// What a run is asked to do.
pub(crate) struct RunConfig {
    pub(crate) speed: f64,
    pub(crate) engines: usize,
    pub(crate) capacity: usize,
    /// Every this many requests, a check: wait until every published batch is applied, then
    /// compare the answer for every engine with the truth (the pause shifts the schedule).
    pub(crate) check_every: usize,
    pub(crate) poll: Duration,
    /// Stop issuing (and report the run as cut short) past this long.
    pub(crate) max_run: Duration,
}

/// What a run measured.
#[derive(Default)]
pub(crate) struct RunReport {
    pub(crate) issued: usize,
    pub(crate) cut_short: bool,
    pub(crate) wall: Duration,
    /// Gathered from the monitor: publish to applied (upper bounds, at the poll's resolution).
    pub(crate) apply_lag: Vec<Duration>,
    /// Most batches published and not yet applied, over all engines, at any poll.
    pub(crate) max_backlog: u64,
    /// From the end of issuing to every batch applied.
    pub(crate) drain: Duration,
    /// Query round trips as the router saw them.
    pub(crate) query: Vec<Duration>,
    /// How late each request was issued against its schedule.
    pub(crate) lateness: Vec<Duration>,
    /// Routing answers whose count for the chosen engine differed from its true prefix at that
    /// moment (its latest events were still on their way): stale, not wrong.
    pub(crate) stale: usize,
    /// Checked (question, engine) answers once everything was applied, and those that differed.
    pub(crate) checked: usize,
    pub(crate) wrong: usize,
    pub(crate) mismatches: Vec<String>,
    pub(crate) hits: HitRate,
    pub(crate) counts: EventCounts,
}

/// Publish times per engine and seq, and what the monitor saw.
#[derive(Default)]
struct Shared {
    published: Vec<Vec<Option<Instant>>>,
    applied: Vec<u64>,
    lag: Vec<Duration>,
    max_backlog: u64,
}

pub(crate) async fn run(requests: &[Request], prompts: &mut Prompts, cfg: &RunConfig) -> RunReport {
    let service = InProcess::start().await;
    let (mut http, mut client) = (
        HttpConn::connect(service.http_port).await.expect("HTTP"),
        grpc(service.rpc_port).await,
    );
    let mut pubs = Vec::new();
    for i in 0..cfg.engines {
        let p = Publisher::bind(Fleet::instance(i), 0).await;
        register(&mut client, &p, MODEL).await;
        pubs.push(p);
    }
    let empty: Vec<Bytes> = pubs.iter().map(|_| batch(vec![], 0)).collect();
    handshake(&mut pubs, &empty, &mut http).await;
    let shared = Arc::new(Mutex::new(Shared {
        published: vec![vec![None]; cfg.engines],
        applied: vec![0; cfg.engines],
        ..Shared::default()
    }));
    let stop = CancellationToken::new();
    let monitor = tokio::spawn(monitor(
        HttpConn::connect(service.http_port).await.expect("HTTP"),
        shared.clone(),
        cfg.poll,
        stop.clone(),
    ));
    let mut lean = LeanGrpc::connect(service.rpc_port).await.expect("gRPC");
    let mut report = RunReport::default();
    let (mut fleet, mut router) = (
        Fleet::new(cfg.engines, cfg.capacity),
        Router::new(Policy::KvAware),
    );
    let first_ms = requests.first().map_or(0, |r| r.arrival_ms);
    let (started, mut paused) = (Instant::now(), Duration::ZERO);
    for (n, r) in requests.iter().enumerate() {
        let offset = Duration::from_secs_f64((r.arrival_ms - first_ms) as f64 / 1e3 / cfg.speed);
        let due = started + paused + offset;
        tokio::time::sleep_until(due.into()).await;
        report.lateness.push(due.elapsed());
        if started.elapsed() > cfg.max_run + paused {
            report.cut_short = true;
            break;
        }
        fleet.advance(r.arrival_ms);
        let prompt = prompts.prompt(r);
        let check = (n + 1) % cfg.check_every == 0;
        if check {
            let began = Instant::now();
            wait_applied(&shared).await;
            paused += began.elapsed();
        }
        let began = Instant::now();
        let answer = ask(&mut lean, &prompt).await;
        report.query.push(began.elapsed());
        let matched = matched(&answer, cfg.engines);
        if check {
            compare(&mut report, n, &matched, &fleet.truth(&prompt.keys));
        }
        let e = router.choose(prompt.keys.len(), &matched, &fleet.load());
        let admission = fleet.admit(e, &prompt, r.arrival_ms, r.duration_ms());
        report.stale += usize::from(admission.hit_blocks != matched[e]);
        report.hits.add(r, admission.hit_blocks);
        report.counts.add(&admission);
        report.issued += 1;
        if admission.events.is_empty() {
            continue;
        }
        let payload = encode(&admission.events, &prompt);
        shared.lock().expect("shared").published[e].push(Some(Instant::now()));
        pubs[e].publish(payload).await;
    }
    let issued_at = Instant::now();
    wait_applied(&shared).await;
    report.drain = issued_at.elapsed();
    // A last check of every engine on prompts spread over the run, on the final state.
    let step = (report.issued / 16).max(1);
    for n in (0..report.issued).step_by(step) {
        let prompt = prompts.prompt(&requests[n]);
        let answer = ask(&mut lean, &prompt).await;
        let got = matched(&answer, cfg.engines);
        compare(&mut report, n, &got, &fleet.truth(&prompt.keys));
    }
    report.wall = started.elapsed();
    stop.cancel();
    monitor.await.expect("monitor");
    let mut s = shared.lock().expect("shared");
    report.apply_lag = std::mem::take(&mut s.lag);
    report.max_backlog = s.max_backlog;
    drop((lean, client, http, pubs));
    service.stop();
    report
}

async fn ask(lean: &mut LeanGrpc, prompt: &Prompt) -> pb::QueryResponse {
    let request = pb::QueryRequest {
        model_name: MODEL.into(),
        block_size: BLOCK_SIZE as i64,
        token_ids: prompt.tokens.clone(),
        ..Default::default()
    };
    let answer = lean.unary(QUERY, &framed(&request)).await.expect("query");
    let answer = pb::QueryResponse::decode(answer).expect("a QueryResponse");
    assert_eq!(answer.ret, 0, "{:?}", answer.error);
    answer
}

/// Blocks each engine matched, as the index answered.
fn matched(answer: &pb::QueryResponse, engines: usize) -> Vec<usize> {
    (0..engines)
        .map(|i| {
            let hit = answer.hits.get(&Fleet::instance(i));
            hit.map_or(0, |h| h.device as usize / BLOCK_SIZE)
        })
        .collect()
}

fn compare(report: &mut RunReport, n: usize, got: &[usize], truth: &[usize]) {
    for (i, (g, t)) in got.iter().zip(truth).enumerate() {
        report.checked += 1;
        if g != t {
            report.wrong += 1;
            if report.mismatches.len() < 8 {
                report.mismatches.push(format!(
                    "request {n}: engine {i} holds {t} blocks, the service answered {g}"
                ));
            }
        }
    }
}

/// One batch per admission: its removals (one event per evicted block, as vLLM's pool sends
/// them), then its stored run.
fn encode(events: &[Event], prompt: &Prompt) -> Bytes {
    let mp = events
        .iter()
        .map(|e| match e {
            Event::Removed(key) => removed(std::slice::from_ref(key), "GPU"),
            Event::Stored {
                parent,
                first,
                keys,
            } => stored(
                keys,
                *parent,
                prompt.block_tokens(*first, keys.len()),
                "GPU",
            ),
        })
        .collect();
    batch(mp, 0)
}

/// Wait until every engine's published batches are applied (at most 120 s).
async fn wait_applied(shared: &Mutex<Shared>) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let done = {
            let s = shared.lock().expect("shared");
            (s.published.iter().zip(&s.applied)).all(|(p, a)| p.len() as u64 - 1 <= *a)
        };
        if done {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "published batches not applied within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Poll `/services/status` every `poll`: a batch counts as applied once its subscription consumed
/// it and nothing is pending for the context (`last_seq - pending_batches`; each batch feeds the
/// one context); its lag is the time from its publish to the poll that first saw it applied.
async fn monitor(
    mut http: HttpConn,
    shared: Arc<Mutex<Shared>>,
    poll: Duration,
    stop: CancellationToken,
) {
    loop {
        let rows = status(&mut http).await;
        let now = Instant::now();
        record(&mut shared.lock().expect("shared"), rows, now);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(poll) => {}
        }
    }
}

/// What one poll saw: advance each engine's applied seq and time the batches newly applied.
fn record(s: &mut Shared, rows: Vec<serde_json::Value>, now: Instant) {
    let mut backlog = 0;
    for row in rows {
        let service = row["service"].as_str().unwrap_or_default();
        let Some(i) = (service.strip_prefix('e'))
            .and_then(|rest| rest.split('|').next())
            .and_then(|i| i.parse::<usize>().ok())
            .filter(|i| *i < s.applied.len())
        else {
            continue;
        };
        let last = row["last_seq"].as_u64().unwrap_or(0);
        let applied = last.saturating_sub(row["pending_batches"].as_u64().unwrap_or(0));
        let before = s.applied[i];
        for seq in before + 1..=applied {
            if let Some(Some(at)) = s.published[i].get(seq as usize).copied() {
                s.lag.push(now - at);
            }
        }
        s.applied[i] = before.max(applied);
        backlog += (s.published[i].len() as u64 - 1).saturating_sub(s.applied[i]);
    }
    s.max_backlog = s.max_backlog.max(backlog);
}

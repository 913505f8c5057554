//! The tasks that keep a fleet in step: each engine's description and load read on the
//! engine's own schedule, in the lanes of `schedule`, and the engines other replicas share
//! listed every `engine_refresh_ms` (`docs/engine-discovery.md`, "Keeping in step").

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::fleet::{Engine, Fleet};
use super::schedule::{Due, Lanes, TICK};
use super::spec::EngineSpec;

/// Reads in flight at once in the fast lane (the slow lane has half as many).
const CONCURRENT_READS: usize = 16;

impl Fleet {
    /// Read each engine's description on its own schedule and bring it in step, until `stop`
    /// (see `schedule`: no engine waits for another's read).
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let lanes = Lanes::new(CONCURRENT_READS);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut shared_due = Instant::now();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let now = Instant::now();
            if now >= shared_due {
                self.follow_shared().await;
                shared_due = now + self.settings.refresh;
            }
            for (spec, failed) in self.due(now, |e| &mut e.describe_due, |_| true) {
                let Some(slot) = lanes.try_slot(failed) else {
                    continue;
                };
                if !self.start(&spec, |e| &mut e.describe_due) {
                    continue;
                }
                let fleet = Arc::clone(&self);
                tokio::spawn(async move {
                    let read = fleet.read(&spec).await;
                    let ok = read.is_ok();
                    let services = fleet.ops.list_services().await.ok();
                    fleet.step(&spec, read, services.as_deref()).await;
                    let interval = fleet.settings.refresh;
                    fleet.finish(&spec, |e| &mut e.describe_due, ok, interval);
                    drop(slot);
                });
            }
        }
    }

    /// Read each readable engine's load every `load_refresh`, each on its own schedule, until
    /// `stop`: a router weighs queues that change within seconds, more often than descriptions
    /// are read.
    pub async fn run_loads(self: Arc<Self>, stop: CancellationToken) {
        let lanes = Lanes::new(CONCURRENT_READS);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (limits, ranks) = (self.settings.fetch, self.settings.max_ranks_per_engine);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let readable = |e: &Engine| {
                e.failing.is_none() && e.last_read.is_some() && self.allowed(&e.spec).is_ok()
            };
            for (spec, failed) in self.due(Instant::now(), |e| &mut e.load_due, readable) {
                let Some(slot) = lanes.try_slot(failed) else {
                    continue;
                };
                if !self.start(&spec, |e| &mut e.load_due) {
                    continue;
                }
                let fleet = Arc::clone(&self);
                tokio::spawn(async move {
                    let load = super::load::read_load(&spec, limits, ranks).await;
                    let ok = load.is_some();
                    if let Some(load) = load {
                        let mut engines = fleet.lock_engines();
                        if let Some(e) = engines.get_mut(&spec.key()).filter(|e| e.spec == spec) {
                            e.load = Some((Instant::now(), load));
                        }
                    }
                    let interval = fleet.settings.load_refresh;
                    fleet.finish(&spec, |e| &mut e.load_due, ok, interval);
                    drop(slot);
                });
            }
        }
    }

    /// The engines `eligible` whose read of one kind (`due`) is due at `now`, each with whether
    /// its last such read failed (its lane).
    fn due(
        &self,
        now: Instant,
        due: impl Fn(&mut Engine) -> &mut Due,
        eligible: impl Fn(&Engine) -> bool,
    ) -> Vec<(EngineSpec, bool)> {
        let mut engines = self.lock_engines();
        engines
            .values_mut()
            .filter(|e| eligible(e))
            .filter_map(|e| {
                let d = *due(e);
                d.is_due(now).then(|| (e.spec.clone(), d.failures > 0))
            })
            .collect()
    }

    /// Mark `spec`'s read of one kind running; false when the engine went or changed.
    fn start(&self, spec: &EngineSpec, due: impl Fn(&mut Engine) -> &mut Due) -> bool {
        let mut engines = self.lock_engines();
        match engines.get_mut(&spec.key()).filter(|e| e.spec == *spec) {
            Some(e) => {
                due(e).running = true;
                true
            }
            None => false,
        }
    }

    /// `spec`'s read of one kind ended: the next is due one `interval` on (later after
    /// failures).
    fn finish(
        &self,
        spec: &EngineSpec,
        due: impl Fn(&mut Engine) -> &mut Due,
        ok: bool,
        interval: std::time::Duration,
    ) {
        let mut engines = self.lock_engines();
        if let Some(e) = engines.get_mut(&spec.key()).filter(|e| e.spec == *spec) {
            due(e).done(ok, interval, Instant::now());
        }
    }
}

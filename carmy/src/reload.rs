//! What an app tells about its configuration reloads: how many ended each way, and a
//! `tools.changed` event whenever one changed what a trust level sees in the catalog. The
//! reloading itself is the configuration snapshot's (`settings`).

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::broadcast;

use crate::principal::TrustLevel;

/// How many `tools.changed` events a slow subscriber may fall behind before it misses some.
const EVENT_BUFFER: usize = 16;

/// A `tools.changed` event: a reload changed what some trust level sees in the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolsChanged {
    /// Indexed by [`TrustLevel::index`].
    pub(crate) versions: [String; 4],
}

impl ToolsChanged {
    /// The event's name, as webhooks deliver it (`protocol.md` §8).
    pub const NAME: &'static str = "tools.changed";

    /// The new `tools_version` that callers trusted at `trust` see.
    pub fn tools_version(&self, trust: TrustLevel) -> &str {
        &self.versions[trust.index()]
    }
}

/// How many reloads ended each way since the start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReloadCounts {
    /// A new configuration was swapped in.
    pub applied: u64,
    /// The file had not changed: nothing was done.
    pub unchanged: u64,
    /// The file could not be read, parsed or built: the old configuration stayed.
    pub failed: u64,
    /// The file changed a restart-only key: the old configuration stayed.
    pub restart_required: u64,
}

/// The reloads of an app, from [`App::reloads`](crate::App::reloads): their counts by result,
/// and the `tools.changed` events. Cloning is cheap; every clone sees the same reloads.
#[derive(Debug, Clone, Default)]
pub struct Reloads {
    inner: Arc<ReloadsInner>,
}

#[derive(Debug)]
struct ReloadsInner {
    /// By result; `/metrics` exposes the same family as `carmy_config_reloads_total`.
    counts: Family<ReloadResult, Counter>,
    events: broadcast::Sender<ToolsChanged>,
}

/// The label of a reload's result.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReloadResult {
    result: &'static str,
}

impl ReloadResult {
    pub(crate) const APPLIED: Self = ReloadResult { result: "applied" };
    pub(crate) const UNCHANGED: Self = ReloadResult {
        result: "unchanged",
    };
    pub(crate) const FAILED: Self = ReloadResult { result: "failed" };
    pub(crate) const RESTART_REQUIRED: Self = ReloadResult {
        result: "restart_required",
    };
}

impl Default for ReloadsInner {
    fn default() -> Self {
        ReloadsInner {
            counts: Family::default(),
            events: broadcast::channel(EVENT_BUFFER).0,
        }
    }
}

impl Reloads {
    /// The counts now.
    pub fn counts(&self) -> ReloadCounts {
        let count = |result| self.inner.counts.get_or_create(&result).get();
        ReloadCounts {
            applied: count(ReloadResult::APPLIED),
            unchanged: count(ReloadResult::UNCHANGED),
            failed: count(ReloadResult::FAILED),
            restart_required: count(ReloadResult::RESTART_REQUIRED),
        }
    }

    /// The counts as a metric family, shared with these reloads.
    pub(crate) fn family(&self) -> Family<ReloadResult, Counter> {
        self.inner.counts.clone()
    }

    /// Receives every `tools.changed` event from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<ToolsChanged> {
        self.inner.events.subscribe()
    }

    /// Counts a reload that ended as `result`.
    pub(crate) fn count(&self, result: &ReloadResult) {
        self.inner.counts.get_or_create(result).inc();
    }

    /// Tells every subscriber that a reload changed the catalog.
    pub(crate) fn publish(&self, changed: ToolsChanged) {
        // No subscriber is no error.
        let _ = self.inner.events.send(changed);
    }
}

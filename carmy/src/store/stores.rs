//! The stores an app runs on: one per concern, from one engine or from several.

use std::sync::Arc;

use super::{
    ApprovalStore, ConsentStore, Engine, EventStore, ExecutionStore, KeyStore, MemoryStore,
};

/// The store of each concern an app runs on.
#[derive(Clone)]
pub(crate) struct Stores {
    pub(crate) keys: Arc<dyn KeyStore>,
    pub(crate) executions: Arc<dyn ExecutionStore>,
    pub(crate) events: Arc<dyn EventStore>,
    pub(crate) approvals: Arc<dyn ApprovalStore>,
    pub(crate) consents: Arc<dyn ConsentStore>,
}

impl Stores {
    /// Every concern on `engine`; approvals and consents in memory until the shared engines
    /// keep them.
    pub(crate) fn from_engine<E: Engine>(engine: Arc<E>) -> Self {
        let memory = Arc::new(MemoryStore::new());
        Stores {
            keys: Arc::clone(&engine) as Arc<dyn KeyStore>,
            executions: Arc::clone(&engine) as Arc<dyn ExecutionStore>,
            events: engine,
            approvals: Arc::clone(&memory) as Arc<dyn ApprovalStore>,
            consents: memory,
        }
    }
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores").finish_non_exhaustive()
    }
}

/// The stores a host chose, concern by concern; the others come from one in-memory engine.
#[derive(Default)]
pub(crate) struct StoreChoice {
    keys: Option<Arc<dyn KeyStore>>,
    executions: Option<Arc<dyn ExecutionStore>>,
    events: Option<Arc<dyn EventStore>>,
    approvals: Option<Arc<dyn ApprovalStore>>,
    consents: Option<Arc<dyn ConsentStore>>,
}

impl StoreChoice {
    /// Every concern on `engine`, whatever was chosen before.
    pub(crate) fn engine(&mut self, engine: impl Engine) {
        let Stores {
            keys,
            executions,
            events,
            approvals,
            consents,
        } = Stores::from_engine(Arc::new(engine));
        *self = StoreChoice {
            keys: Some(keys),
            executions: Some(executions),
            events: Some(events),
            approvals: Some(approvals),
            consents: Some(consents),
        };
    }

    pub(crate) fn keys(&mut self, store: impl KeyStore) {
        self.keys = Some(Arc::new(store));
    }

    pub(crate) fn executions(&mut self, store: impl ExecutionStore) {
        self.executions = Some(Arc::new(store));
    }

    pub(crate) fn events(&mut self, store: impl EventStore) {
        self.events = Some(Arc::new(store));
    }

    pub(crate) fn approvals(&mut self, store: impl ApprovalStore) {
        self.approvals = Some(Arc::new(store));
    }

    pub(crate) fn consents(&mut self, store: impl ConsentStore) {
        self.consents = Some(Arc::new(store));
    }

    /// The chosen stores, one [`MemoryStore`] serving every concern not chosen.
    pub(crate) fn build(self) -> Stores {
        let StoreChoice {
            keys,
            executions,
            events,
            approvals,
            consents,
        } = self;
        let mut memory = None;
        let mut memory = || {
            memory
                .get_or_insert_with(|| Stores::from_engine(Arc::new(MemoryStore::new())))
                .clone()
        };
        Stores {
            keys: keys.unwrap_or_else(|| memory().keys),
            executions: executions.unwrap_or_else(|| memory().executions),
            events: events.unwrap_or_else(|| memory().events),
            approvals: approvals.unwrap_or_else(|| memory().approvals),
            consents: consents.unwrap_or_else(|| memory().consents),
        }
    }
}

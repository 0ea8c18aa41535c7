//! The stores an app runs on: one per concern, from one engine or from several.

use std::sync::Arc;

use super::{Engine, EventStore, ExecutionStore, KeyStore, MemoryStore};

/// The store of each concern an app runs on.
#[derive(Clone)]
pub(crate) struct Stores {
    pub(crate) keys: Arc<dyn KeyStore>,
    pub(crate) executions: Arc<dyn ExecutionStore>,
    pub(crate) events: Arc<dyn EventStore>,
}

impl Stores {
    /// Every concern on `engine`.
    pub(crate) fn from_engine<E: Engine>(engine: Arc<E>) -> Self {
        Stores {
            keys: Arc::clone(&engine) as Arc<dyn KeyStore>,
            executions: Arc::clone(&engine) as Arc<dyn ExecutionStore>,
            events: engine,
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
}

impl StoreChoice {
    /// Every concern on `engine`, whatever was chosen before.
    pub(crate) fn engine(&mut self, engine: impl Engine) {
        let Stores {
            keys,
            executions,
            events,
        } = Stores::from_engine(Arc::new(engine));
        *self = StoreChoice {
            keys: Some(keys),
            executions: Some(executions),
            events: Some(events),
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

    /// The chosen stores, a [`MemoryStore`] (one for all) serving the concerns not chosen.
    pub(crate) fn build(self) -> Stores {
        match (self.keys, self.executions, self.events) {
            (Some(keys), Some(executions), Some(events)) => Stores {
                keys,
                executions,
                events,
            },
            (keys, executions, events) => {
                let memory = Stores::from_engine(Arc::new(MemoryStore::new()));
                Stores {
                    keys: keys.unwrap_or(memory.keys),
                    executions: executions.unwrap_or(memory.executions),
                    events: events.unwrap_or(memory.events),
                }
            }
        }
    }
}

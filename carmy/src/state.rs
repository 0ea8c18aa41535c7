//! Shared values handed to tools: `.state(value)` on the builder, `State<T>` in the tool.

use std::any::{Any, TypeId};
use std::collections::HashMap;

/// A value shared by the tools of an app, registered with [`App::state`](crate::App::state).
///
/// ```ignore
/// #[carmy::tool(effect = "read")]
/// async fn count(State(db): State<Db>) -> Result<u64, ToolError> { Ok(db.count().await) }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct State<T>(pub T);

/// The app's state values, by type; looked up by every call of a tool that takes one, so
/// hashed by foldhash rather than SipHash (the keys are the app's own types).
#[derive(Default)]
pub(crate) struct StateMap {
    values: HashMap<TypeId, Box<dyn Any + Send + Sync>, foldhash::fast::RandomState>,
}

impl StateMap {
    pub(crate) fn insert<T: Clone + Send + Sync + 'static>(&mut self, value: T) {
        self.values.insert(TypeId::of::<T>(), Box::new(value));
    }

    pub(crate) fn get<T: 'static>(&self) -> Option<&T> {
        self.values.get(&TypeId::of::<T>())?.downcast_ref()
    }

    pub(crate) fn contains(&self, type_id: TypeId) -> bool {
        self.values.contains_key(&type_id)
    }
}

impl std::fmt::Debug for StateMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateMap")
            .field("len", &self.values.len())
            .finish()
    }
}

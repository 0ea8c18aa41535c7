//! The builder that turns the registered tools into an `axum::Router`.

use std::sync::Arc;

use crate::catalog::Catalog;
use crate::error::Error;
use crate::http;
use crate::state::StateMap;
use crate::tool::{self, ToolDescriptor};

/// Starts an app with every tool registered by `#[carmy::tool]` in the program.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let router: axum::Router = carmy::app().name("shop").router()?;
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
/// axum::serve(listener, router).await?;
/// # Ok(()) }
/// ```
pub fn app() -> App {
    App::new().registered_tools()
}

/// Builds the router that serves a set of tools over carmy/1.
#[must_use]
#[derive(Debug)]
pub struct App {
    name: Option<String>,
    tools: Vec<&'static ToolDescriptor>,
    states: StateMap,
}

impl Default for App {
    fn default() -> Self {
        Self::new()
    }
}

impl App {
    /// An app with no tools: add them with [`App::tool`] or [`App::registered_tools`].
    pub fn new() -> Self {
        App {
            name: None,
            tools: Vec::new(),
            states: StateMap::default(),
        }
    }

    /// Adds every tool registered by `#[carmy::tool]` (those without `register = false`).
    pub fn registered_tools(mut self) -> Self {
        self.tools.extend(tool::registered());
        self
    }

    /// Adds one tool, typically one declared with `register = false`: `.tool(my_tool::TOOL)`.
    pub fn tool(mut self, tool: &'static ToolDescriptor) -> Self {
        self.tools.push(tool);
        self
    }

    /// The server's name in the discovery document. Defaults to the executable's name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Shares a value with the tools that take `State<T>`.
    pub fn state<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Self {
        self.states.insert(value);
        self
    }

    /// Checks the app and builds the router. Every mistake (duplicate tool names, missing
    /// state, an input schema that is not an object) is found here, never at request time.
    pub fn router(self) -> Result<axum::Router, Error> {
        let name = match self.name {
            Some(name) if name.trim().is_empty() => return Err(Error::EmptyName),
            Some(name) => name,
            None => default_name(),
        };
        let catalog = Catalog::build(self.tools, &self.states)?;
        Ok(http::router(&name, Arc::new(catalog)))
    }
}

/// The executable's file name, the natural name of a one-binary service.
fn default_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|path| path.file_stem()?.to_str().map(str::to_owned))
        .unwrap_or_else(|| "carmy".to_owned())
}

//! What `tracing` reports during a test, captured as text.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::DefaultGuard;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// What `tracing` reports on this thread while it is the default subscriber, a line each:
/// `new {span} parent={parent} {field}={value:?}…` for a span opened, `record {field}=…` for
/// fields a span records later, and `{LEVEL} {field}={value:?}…` for an event (its text in the
/// field `message`).
///
/// `tracing` caches across threads which callsites are enabled: one first hit by another test
/// while this subscriber is being set can be cached as disabled. A test that must see every
/// callsite calls [`Captured::clear`] once its subscriber is set.
#[derive(Debug, Clone, Default)]
pub struct Captured {
    lines: Arc<Mutex<Vec<String>>>,
}

impl Captured {
    /// Makes this the default subscriber of the thread until the guard drops, for everything
    /// up to `level`.
    pub fn set_default(&self, level: tracing::Level) -> DefaultGuard {
        tracing::subscriber::set_default(
            tracing_subscriber::registry()
                .with(self.clone().with_filter(LevelFilter::from_level(level))),
        )
    }

    /// Forgets what was captured, and has every callsite ask the subscriber again.
    pub fn clear(&self) {
        self.lock().clear();
        tracing::callsite::rebuild_interest_cache();
    }

    /// The lines captured so far.
    pub fn lines(&self) -> Vec<String> {
        self.lock().clone()
    }

    /// The lines captured so far, as one text.
    pub fn text(&self) -> String {
        self.lock().join("\n")
    }

    /// The line that opened the span called `name`; fails the test unless exactly one did.
    pub fn opened(&self, name: &str) -> String {
        let prefix = format!("new {name} ");
        let lines = self.lock();
        let found: Vec<&String> = lines
            .iter()
            .filter(|line| line.starts_with(&prefix))
            .collect();
        assert_eq!(found.len(), 1, "one {name} span:\n{}", lines.join("\n"));
        found[0].clone()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<String>> {
        self.lines.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, line: String) {
        self.lock().push(line);
    }
}

/// Appends ` {field}={value:?}` for each field it visits.
struct Fields<'a>(&'a mut String);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={:?}", field.name(), value));
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Captured {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, context: Context<'_, S>) {
        let parent = context
            .span(id)
            .and_then(|span| span.parent())
            .map_or("none", |parent| parent.name());
        let mut line = format!("new {} parent={parent}", attrs.metadata().name());
        attrs.record(&mut Fields(&mut line));
        self.push(line);
    }

    fn on_record(&self, _: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut line = "record".to_owned();
        values.record(&mut Fields(&mut line));
        self.push(line);
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut line = event.metadata().level().to_string();
        event.record(&mut Fields(&mut line));
        self.push(line);
    }
}

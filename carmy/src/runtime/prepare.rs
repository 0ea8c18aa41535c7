//! The checks that need no record: resolve the tool, gate it, validate the arguments.

use super::*;

impl Runtime {
    /// The checks that need no record: resolve, gate, validate. On failure, returns the error
    /// and the arguments (for the suggestions).
    pub(super) fn prepare(
        &self,
        call: Call,
        execution_id: Arc<str>,
        prefer_async: bool,
        started: Instant,
    ) -> Result<Prepared, Rejected> {
        let Call {
            catalog,
            tool,
            arguments,
            request_id,
            principal,
            requester,
        } = call;
        let Some(entry) = catalog.get_visible(&tool, principal.trust()) else {
            let error = tool_not_found(&catalog, &tool, principal.trust());
            return Err(Rejected {
                error,
                tool,
                known: None,
                arguments,
            });
        };
        let descriptor = entry.descriptor;
        if descriptor.confirmation == Confirmation::Required
            && !principal.has_permission(&format!("confirm:{}", descriptor.name))
        {
            let error = ToolError::permission(
                codes::CONFIRMATION_REQUIRED,
                format!("`{}` needs the user's confirmation", descriptor.name),
            )
            .recoverable(true)
            .details(json!({ "permission": format!("confirm:{}", descriptor.name) }));
            return Err(Rejected {
                error,
                tool,
                known: Some(descriptor.name),
                arguments,
            });
        }
        if let Some(error) = validation::check(entry, &arguments) {
            return Err(Rejected {
                error,
                tool,
                known: Some(descriptor.name),
                arguments,
            });
        }
        let request_id: Option<Arc<str>> = request_id.map(Arc::from);
        let idempotency = request_id.as_ref().map(|request_id| {
            (
                IdempotencyKey::new(principal.shared_id(), Arc::clone(request_id)),
                fingerprint::fingerprint(&entry.name, &arguments),
            )
        });
        let timeout = entry.timeout.unwrap_or(self.settings.default_timeout);
        // Executions belong to an identified caller: an anonymous one could not be read back
        // by its caller alone.
        let keepable = principal.trust() != TrustLevel::Anonymous;
        let detached = keepable
            && match descriptor.mode {
                Mode::Async => true,
                Mode::Sync => false,
                Mode::Either => prefer_async,
            };
        let kept = keepable && (detached || idempotency.is_some());
        Ok(Prepared {
            execution_id,
            tool: descriptor,
            arguments: Arc::new(arguments),
            request_id,
            principal,
            requester,
            idempotency,
            timeout,
            // From the call's start, read once for its duration too.
            deadline: started + timeout,
            kept,
            detached,
        })
    }
}

/// `TOOL_NOT_FOUND`, naming (clipped) what was asked for and the nearest tools the caller may
/// see.
pub(super) fn tool_not_found(catalog: &Catalog, name: &str, trust: TrustLevel) -> ToolError {
    let suggestions = catalog.nearest(name, trust);
    let shown = clip(name);
    let message = match suggestions.as_slice() {
        [] => format!("no tool named `{shown}`"),
        [only] => format!("no tool named `{shown}`; did you mean `{only}`?"),
        several => format!(
            "no tool named `{shown}`; did you mean one of {}?",
            several
                .iter()
                .map(|name| format!("`{name}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    ToolError::not_found(codes::TOOL_NOT_FOUND, message)
        .details(json!({ "tool": shown, "suggestions": suggestions }))
}

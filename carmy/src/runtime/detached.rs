//! Executions that run detached from the connection (`protocol.md` §9): started, answered with
//! `202`, and waited for by a transport that has no asynchronous answer.

use super::*;

impl Runtime {
    /// Starts `prepared` detached from the connection: reserve, take a slot, keep the
    /// execution, then run it in its own task under its deadline. `Err`: answered at once (a
    /// replay, a conflict, no capacity).
    pub(super) async fn start(
        self: Arc<Self>,
        prepared: Prepared,
        span: tracing::Span,
        started: Instant,
    ) -> Result<Accepted, Outcome> {
        // Nobody's connection: only the store (a DELETE) or a shutdown cancels it.
        let cancel = CancellationToken::new();
        if let Some((key, fingerprint)) = &prepared.idempotency {
            match self
                .reserve(&prepared, key, fingerprint, &cancel, None, false)
                .instrument(span.clone())
                .await
            {
                Claim::Reserved => {}
                Claim::Answered(outcome) => return Err(outcome),
                Claim::HeldBy(execution_id) => {
                    return Ok(Accepted {
                        execution_id,
                        tool: prepared.tool.name,
                    });
                }
            }
        }
        let slot = self.admit(&prepared, None).instrument(span.clone()).await?;
        let accepted = Accepted {
            execution_id: prepared.execution_id.clone(),
            tool: prepared.tool.name,
        };
        let runtime = Arc::clone(&self);
        self.tasks.spawn(
            async move {
                let tool = prepared.tool.name;
                let outcome = runtime.perform(&prepared, slot, &cancel, None).await;
                let elapsed = started.elapsed();
                record_span(&tracing::Span::current(), &outcome, elapsed);
                count_answer(runtime.metrics.as_deref(), Some(tool), &outcome, elapsed);
            }
            .instrument(span),
        );
        Ok(accepted)
    }

    /// The answer of a detached execution, once it has ended (read back from the store).
    pub(super) async fn wait_for(&self, principal: &Principal, accepted: &Accepted) -> Outcome {
        loop {
            let changed = self
                .stores
                .executions
                .execution_changed(&accepted.execution_id);
            match self
                .stores
                .executions
                .execution(principal.id(), &accepted.execution_id)
                .await
            {
                Ok(Some(record)) => {
                    if let Some(ended) = record.outcome {
                        return Outcome {
                            response: ended.response,
                            replayed: false,
                            retry_after: None,
                        };
                    }
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::error!(%error, "could not read a detached execution back");
                    let error = ToolError::capacity(
                        codes::IDEMPOTENCY_UNAVAILABLE,
                        "the idempotency store is unavailable",
                    )
                    .retryable(Duration::from_secs(1));
                    return answer_error(
                        &accepted.execution_id,
                        ExecutionStatus::Failed,
                        &error,
                        &[],
                    );
                }
            }
            changed.await;
        }
    }
}

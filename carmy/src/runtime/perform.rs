//! Running an admitted call: its in-flight slot, its record while it runs, the tool, and what
//! is recorded and published once it has ended.

use super::*;

impl Runtime {
    /// Reserve → run → record. Runs in its own task so the record is written even when the
    /// client is gone.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn's future would be larger"
    )]
    pub(super) fn run(
        self: Arc<Self>,
        prepared: Prepared,
        cancel: CancellationToken,
        events: Option<EventSender>,
    ) -> impl Future<Output = Outcome> + Send + use<> {
        // An async block rather than an async fn, whose future keeps a second copy of its
        // arguments: this one is boxed for every call with a `request_id`.
        async move {
            if let Some((key, fingerprint)) = &prepared.idempotency {
                match self
                    .reserve(&prepared, key, fingerprint, &cancel, events.as_ref(), true)
                    .await
                {
                    Claim::Reserved => {}
                    Claim::Answered(outcome) => return outcome,
                    Claim::HeldBy(execution_id) => {
                        // Only an async start asks not to wait; a synchronous call always waits.
                        tracing::error!(%execution_id, "a synchronous call did not wait");
                        let error = ToolError::internal(codes::INTERNAL, "internal error");
                        return answer_error(
                            &prepared.execution_id,
                            ExecutionStatus::Failed,
                            &error,
                            &[],
                        );
                    }
                }
            }
            let slot = match self.admit(&prepared, events.as_ref()).await {
                Ok(slot) => slot,
                Err(outcome) => return outcome,
            };
            self.perform(&prepared, slot, &cancel, events.as_ref())
                .await
        }
    }

    /// Takes an in-flight slot and, for a kept execution, keeps it in the store: visible to
    /// its caller from now on. `Err`: the answer (no capacity, the store failed).
    pub(super) async fn admit(
        &self,
        prepared: &Prepared,
        events: Option<&EventSender>,
    ) -> Result<Slot, Outcome> {
        let Some(slot) = self.slot(&prepared.principal) else {
            if let Some((key, _)) = &prepared.idempotency {
                self.release(prepared, key).await;
            }
            return Err(self.overloaded(prepared, events));
        };
        if prepared.kept {
            let lease = prepared.deadline.saturating_duration_since(Instant::now()) + LEASE_MARGIN;
            if let Err(store_error) = self
                .stores
                .executions
                .begin_execution(
                    prepared.principal.id(),
                    &prepared.execution_id,
                    prepared.tool.name,
                    lease,
                )
                .await
            {
                if let Some((key, _)) = &prepared.idempotency {
                    self.release(prepared, key).await;
                }
                return Err(self.store_failed(prepared, &store_error, events));
            }
        }
        Ok(slot)
    }

    /// An in-flight slot for `principal`, if one is free and the caller holds less than its
    /// share.
    pub(super) fn slot(&self, principal: &Principal) -> Option<Slot> {
        self.in_flight.take(principal)
    }

    /// The answer when every in-flight slot is taken, or the caller's share of them.
    pub(super) fn overloaded(&self, prepared: &Prepared, events: Option<&EventSender>) -> Outcome {
        let error = ToolError::capacity(codes::OVERLOADED, "too many executions in flight")
            .retryable(Duration::from_secs(1));
        self.answer_failure(prepared, ExecutionStatus::Failed, &error, events)
    }

    /// Runs an execution without a record, the common call, as one function while it can: a
    /// tool that ends on its first poll (most do) is answered without a timer, a cancellation
    /// waiter or a future for each step of the pipeline. `Err`: the tool waits (or is serial,
    /// and waits for its turn first), and the rest runs in the future returned, under the
    /// deadline and the cancellation tokens.
    pub(super) fn perform_unrecorded(
        self: &Arc<Self>,
        prepared: Prepared,
        cancel: Option<CancellationToken>,
        events: Option<EventSender>,
    ) -> Result<Outcome, Pin<Box<dyn Future<Output = Outcome> + Send>>> {
        let Some(slot) = self.slot(&prepared.principal) else {
            return Ok(self.overloaded(&prepared, events.as_ref()));
        };
        emit_started(events.as_ref(), &prepared.execution_id, prepared.tool.name);
        let running = self.metrics.as_deref().map(Metrics::execution_running);
        let (mut call, cancel_on_exit) = self.invocation(&prepared, events.as_ref());
        let serial = self.serial.get(prepared.tool.name).cloned();
        if serial.is_none()
            && let Some(ended) = first_poll(&mut call)
        {
            // The tool's future first: the guard then sees whether anything else kept the
            // context.
            drop((call, cancel_on_exit, running, slot));
            return Ok(self.outcome_of(&prepared, ran(ended), events.as_ref()).0);
        }
        // The gauge borrows the runtime: the future takes a count of its own.
        drop(running);
        let runtime = Arc::clone(self);
        Err(Box::pin(async move {
            let running = runtime.metrics.as_deref().map(Metrics::execution_running);
            let work = serialized(serial, call);
            let ran = runtime
                .interruptible(work, cancel.as_ref(), prepared.deadline)
                .await;
            drop((cancel_on_exit, running, slot));
            runtime.outcome_of(&prepared, ran, events.as_ref()).0
        }))
    }

    /// Runs the admitted execution and records how it ended.
    pub(super) async fn perform(
        &self,
        prepared: &Prepared,
        _slot: Slot,
        cancel: &CancellationToken,
        events: Option<&EventSender>,
    ) -> Outcome {
        emit_started(events, &prepared.execution_id, prepared.tool.name);
        let running = self.metrics.as_deref().map(Metrics::execution_running);
        let outcome = if prepared.kept {
            // Boxed: its journal and its watch on the store would make the future of every
            // call that records an outcome several times as large.
            Box::pin(self.perform_kept(prepared, running, cancel, events)).await
        } else {
            let ran = self.invoke(prepared, cancel, events).await;
            drop(running);
            self.conclude(prepared, ran, events).await
        };
        self.finished(prepared, &outcome).await;
        outcome
    }

    /// Runs a kept execution: its events go to the store (any replica replays them) and on
    /// to a client streaming this call; a cancellation request through the store cancels it.
    /// `running` counts it in flight until the tool has ended.
    pub(super) async fn perform_kept(
        &self,
        prepared: &Prepared,
        running: Option<Active<'_>>,
        cancel: &CancellationToken,
        events: Option<&EventSender>,
    ) -> Outcome {
        let (recorder, recorded) = journal_channel(KEPT_PROGRESS);
        let mut journal = Journal {
            store: Arc::clone(&self.stores.executions),
            execution_id: prepared.execution_id.clone(),
            events: recorded,
            forward: events.cloned(),
            next_id: FIRST_PROGRESS_ID,
        };
        let requested = cancellation_requested(
            Arc::clone(&self.stores.executions),
            prepared.principal.shared_id(),
            prepared.execution_id.clone(),
        );
        let ran = tokio::select! {
            biased;
            ran = self.invoke(prepared, cancel, Some(&recorder)) => ran,
            () = requested => Ran::Cancelled,
            () = journal.write_forever() => unreachable!("the journal waits for events forever"),
        };
        drop(running);
        journal.write_waiting().await;
        let outcome = self.conclude(prepared, ran, events).await;
        let ended = RecordedOutcome {
            response: outcome.response.clone(),
            event_id: journal.next_id,
        };
        let ttl = self.settings.record_ttl;
        let attempt = || {
            self.stores
                .executions
                .end_execution(&prepared.execution_id, ended.clone(), ttl)
        };
        if let Err(error) = with_backoff(attempt, prepared.lease_end()).await
            && let Some(held_back) = self.logs.record.admit()
        {
            tracing::error!(
                error = %error,
                "could not record how a kept execution ended{}",
                repeated::summary(held_back)
            );
        }
        outcome
    }

    /// `execution.finished`, for an execution with a record: async, or with a `request_id`
    /// (anonymous callers' too).
    #[cfg_attr(not(feature = "events"), allow(clippy::unused_async))]
    pub(super) async fn finished(&self, prepared: &Prepared, outcome: &Outcome) {
        #[cfg(feature = "events")]
        if let Some(events) = &self.events
            && (prepared.kept || prepared.idempotency.is_some())
        {
            // Built only when some subscription takes the event.
            let data = || {
                serde_json::json!({
                    "execution_id": &*prepared.execution_id,
                    "tool": prepared.tool.name,
                    "status": outcome.response.status.as_str(),
                    "caller": prepared.principal.id(),
                })
            };
            events
                .publish(crate::events::EventType::ExecutionFinished, data)
                .await;
        }
        #[cfg(not(feature = "events"))]
        let _ = (prepared, outcome);
    }
}

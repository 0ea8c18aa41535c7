//! The tool itself: its future, polled once outside any timer (most tools end there), then run
//! under the deadline, the client's cancellation and the shutdown, its panics caught.

use super::*;

impl Runtime {
    /// Runs the tool under its deadline and the cancellation tokens, catching panics. A tool
    /// that waits goes on in a boxed future of its own, with the timer and the waiters: the
    /// future of a call whose tool ends on its first poll (most do) stays small.
    pub(super) async fn invoke(
        &self,
        prepared: &Prepared,
        cancel: &CancellationToken,
        events: Option<&EventSender>,
    ) -> Ran {
        let (mut call, cancel_on_exit) = self.invocation(prepared, events);
        let serial = self.serial.get(prepared.tool.name).cloned();
        if serial.is_none()
            && let Some(ended) = first_poll(&mut call)
        {
            drop((call, cancel_on_exit));
            return ran(ended);
        }
        let work = serialized(serial, call);
        let ran = Box::pin(self.interruptible(work, Some(cancel), prepared.deadline)).await;
        drop(cancel_on_exit);
        ran
    }

    /// The tool's future, and the guard that cancels its context when dropped, however the
    /// execution ends (finished, cancelled, shut down, or dropped with its client).
    ///
    /// The context's token is its own, not a child of the shutdown token: a child would take
    /// the shutdown token's lock twice per call, for every call of the process; the shutdown
    /// is watched by [`Runtime::interruptible`] instead.
    pub(super) fn invocation(
        &self,
        prepared: &Prepared,
        events: Option<&EventSender>,
    ) -> (CallFuture, CancelOnExit) {
        let context = Context::new(
            prepared.execution_id.clone(),
            prepared.request_id.clone(),
            prepared.principal.clone(),
            prepared.requester,
            events.cloned(),
            self.health.clone(),
        );
        let cancel_on_exit = context.cancel_on_exit();
        let invocation = Invocation {
            arguments: Arc::clone(&prepared.arguments),
            context,
            states: Arc::clone(&self.states),
        };
        ((prepared.tool.call)(invocation), cancel_on_exit)
    }

    /// Runs `work` until it ends, `cancel` fires (the client went away), the server shuts down
    /// or `deadline` passes. The tool's branch first: a tool that finishes on its first poll
    /// never registers the deadline's timer or the cancellation waiters.
    pub(super) async fn interruptible(
        &self,
        work: impl Future<Output = ToolResult>,
        cancel: Option<&CancellationToken>,
        deadline: Instant,
    ) -> Ran {
        let client_gone = async {
            match cancel {
                Some(cancel) => cancel.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            result = work => ran(result),
            () = client_gone => Ran::Cancelled,
            () = self.shutdown.cancelled() => Ran::Cancelled,
            () = tokio::time::sleep_until(deadline) => Ran::TimedOut,
        }
    }
}

/// How a tool's future ended: its result, or the panic it was unwound with.
pub(super) type ToolResult = std::thread::Result<Result<crate::tool::Output, ToolError>>;

/// How the tool ended, for the answer; a panic is logged here, its message never answered.
pub(super) fn ran(result: ToolResult) -> Ran {
    match result {
        Ok(Ok(output)) => Ran::Output(output),
        Ok(Err(error)) => Ran::Error(error),
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|text| (*text).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-text panic payload".to_owned());
            tracing::error!(panic = %message, "tool panicked");
            Ran::Panicked
        }
    }
}

/// Polls a tool's call once, outside any timer or cancellation waiter: how it ended, if it
/// did (most tools end without waiting). A call that waits goes on under
/// [`Runtime::interruptible`], whose first poll replaces the no-op waker given here.
pub(super) fn first_poll(call: &mut CallFuture) -> Option<ToolResult> {
    let polled = panic::catch_unwind(AssertUnwindSafe(|| {
        call.as_mut()
            .poll(&mut std::task::Context::from_waker(Waker::noop()))
    }));
    match polled {
        Ok(Poll::Ready(result)) => Some(Ok(result)),
        Ok(Poll::Pending) => None,
        Err(panic) => Some(Err(panic)),
    }
}

/// The tool's call, after its turn when the tool is not parallel-safe, catching its panics.
pub(super) async fn serialized(serial: Option<Arc<Mutex<()>>>, call: CallFuture) -> ToolResult {
    let _turn = match &serial {
        Some(lock) => Some(lock.lock().await),
        None => None,
    };
    AssertUnwindSafe(call).catch_unwind().await
}

/// Polls `future` once: its output if it finished, else the future, to go on in a task of its
/// own, whose first poll replaces the no-op waker given here wherever the future waits. An
/// execution that ends without waiting (a quick tool, an in-memory store) costs no task.
pub(crate) fn poll_once<F: Future>(future: F) -> Result<F::Output, Pin<Box<F>>> {
    let mut future = Box::pin(future);
    match future
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    {
        std::task::Poll::Ready(output) => Ok(output),
        std::task::Poll::Pending => Err(future),
    }
}

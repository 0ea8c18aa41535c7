//! How an execution ended: the `status` of an answer.

/// How an execution ended, as far as the transport needs to answer it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExecutionStatus {
    /// The tool returned its output.
    Completed,
    /// The call failed (before or while running).
    Failed,
    /// The execution was cancelled.
    Cancelled,
    /// The execution ran past its deadline.
    TimedOut,
}

impl ExecutionStatus {
    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            ExecutionStatus::Completed => "completed",
            ExecutionStatus::Failed => "failed",
            ExecutionStatus::Cancelled => "cancelled",
            ExecutionStatus::TimedOut => "timed_out",
        }
    }

    /// The status whose wire name is `name` (how stores read back what they wrote).
    pub fn from_wire(name: &str) -> Option<Self> {
        [
            ExecutionStatus::Completed,
            ExecutionStatus::Failed,
            ExecutionStatus::Cancelled,
            ExecutionStatus::TimedOut,
        ]
        .into_iter()
        .find(|status| status.as_str() == name)
    }
}

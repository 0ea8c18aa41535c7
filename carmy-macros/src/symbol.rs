//! The attribute's key names, in one place.

pub(crate) const EFFECT: &str = "effect";
pub(crate) const IDEMPOTENT: &str = "idempotent";
pub(crate) const PARALLEL_SAFE: &str = "parallel_safe";
pub(crate) const CONFIRMATION: &str = "confirmation";
pub(crate) const ACCESS: &str = "access";
pub(crate) const NAME: &str = "name";
pub(crate) const DESCRIPTION: &str = "description";
pub(crate) const TIMEOUT: &str = "timeout";
pub(crate) const REGISTER: &str = "register";
pub(crate) const MODE: &str = "mode";

/// Every valid key, for "did you mean" suggestions.
pub(crate) const KEYS: &[&str] = &[
    EFFECT,
    IDEMPOTENT,
    PARALLEL_SAFE,
    CONFIRMATION,
    ACCESS,
    NAME,
    DESCRIPTION,
    TIMEOUT,
    REGISTER,
    MODE,
];

/// Valid values of `effect`, in the order the catalog documents them.
pub(crate) const EFFECTS: &[&str] = &["none", "read", "write", "external_write", "destructive"];

/// Valid values of `confirmation`.
pub(crate) const CONFIRMATIONS: &[&str] = &["none", "required"];

/// Valid values of `access`, lowest trust first.
pub(crate) const ACCESS_LEVELS: &[&str] = &["anonymous", "known", "partner", "internal"];

/// Valid values of `mode`.
pub(crate) const MODES: &[&str] = &["async", "sync"];

//! Validation of the parsed model. Every rule records its error in the [`Ctxt`] spanned on the
//! tokens at fault and carries on, so all the mistakes of one item are reported together.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::spanned::Spanned;
use syn::{Expr, GenericArgument, Lit, Pat, PathArguments, ReturnType, Type};

use crate::ast::{ParamKind, Tool};
use crate::ctxt::Ctxt;
use crate::symbol::{ACCESS_LEVELS, CONFIRMATIONS, EFFECTS, MODES};

/// A tool that passed validation: everything [`crate::expand`] needs.
pub(crate) struct Spec<'a> {
    pub(crate) tool: &'a Tool,
    pub(crate) name: String,
    /// An expression of type `&'static str`.
    pub(crate) description: TokenStream,
    /// The variant name of `carmy::Effect`.
    pub(crate) effect: &'static str,
    pub(crate) idempotent: bool,
    pub(crate) parallel_safe: bool,
    pub(crate) confirmation_required: bool,
    /// The variant name of `carmy::TrustLevel`.
    pub(crate) access: &'static str,
    pub(crate) timeout_ms: Option<u64>,
    /// The variant name of `carmy::Mode`.
    pub(crate) mode: &'static str,
    pub(crate) register: bool,
    /// `T` of the return type `Result<T, E>`.
    pub(crate) output: &'a Type,
    /// The tokens to blame when the error type does not convert into `ToolError`.
    pub(crate) error_span: Span,
}

/// Validates `tool`; returns `None` when anything was wrong (the errors are in `cx`).
pub(crate) fn check<'a>(cx: &Ctxt, tool: &'a Tool) -> Option<Spec<'a>> {
    check_signature(cx, tool);
    let output = check_return_type(cx, tool);
    let attrs = &tool.attrs;

    let effect = match attrs.effect.get() {
        None if attrs.effect.was_given() => None,
        None => {
            cx.syn_error(syn::Error::new(
                attrs.span,
                format!(
                    "missing `effect`: declare what the tool does, e.g. `effect = \"read\"` \
                     (one of {})",
                    quoted_list(EFFECTS)
                ),
            ));
            None
        }
        Some(lit) => {
            let value = lit.value();
            let effect = match value.as_str() {
                "none" => Some("None"),
                "read" => Some("Read"),
                "write" => Some("Write"),
                "external_write" => Some("ExternalWrite"),
                "destructive" => Some("Destructive"),
                _ => None,
            };
            if effect.is_none() {
                cx.error_spanned_by(
                    lit,
                    format!(
                        "invalid effect `{value}`; expected one of {}",
                        quoted_list(EFFECTS)
                    ),
                );
            }
            effect
        }
    };

    let confirmation_required = match attrs.confirmation.get() {
        None => false,
        Some(lit) => match lit.value().as_str() {
            "none" => false,
            "required" => true,
            other => {
                cx.error_spanned_by(
                    lit,
                    format!(
                        "invalid confirmation `{other}`; expected one of {}",
                        quoted_list(CONFIRMATIONS)
                    ),
                );
                false
            }
        },
    };

    let access = match attrs.access.get() {
        None => "Anonymous",
        Some(lit) => match lit.value().as_str() {
            "anonymous" => "Anonymous",
            "known" => "Known",
            "partner" => "Partner",
            "internal" => "Internal",
            other => {
                cx.error_spanned_by(
                    lit,
                    format!(
                        "invalid access `{other}`; expected one of {}",
                        quoted_list(ACCESS_LEVELS)
                    ),
                );
                "Anonymous"
            }
        },
    };

    let name = match attrs.name.get() {
        Some(lit) => {
            let name = lit.value();
            if !is_valid_tool_name(&name) {
                cx.error_spanned_by(
                    lit,
                    format!(
                        "invalid tool name `{name}`; a tool name is 1 to 128 characters of \
                         letters, digits, `_`, `.` and `-`"
                    ),
                );
            }
            name
        }
        None => tool
            .item
            .sig
            .ident
            .to_string()
            .trim_start_matches("r#")
            .to_owned(),
    };

    let timeout_ms = attrs.timeout.get().and_then(|lit| {
        let parsed = parse_duration_ms(&lit.value());
        if parsed.is_none() {
            cx.error_spanned_by(
                lit,
                format!(
                    "invalid timeout `{}`; write a positive whole number with a unit: \
                     `ms`, `s`, `m` or `h` (e.g. \"250ms\", \"30s\", \"2m\")",
                    lit.value()
                ),
            );
        }
        parsed
    });

    let mode = match attrs.mode.get() {
        None => "Either",
        Some(lit) => match lit.value().as_str() {
            "async" => "Async",
            "sync" => "Sync",
            other => {
                let hint = match crate::attr::closest(other, MODES) {
                    Some(mode) => format!("did you mean `\"{mode}\"`?"),
                    None => format!("expected one of {}", quoted_list(MODES)),
                };
                cx.error_spanned_by(lit, format!("invalid mode `{other}`; {hint}"));
                "Either"
            }
        },
    };

    let description = check_description(cx, tool);

    let flag = |attr: &crate::attr::Attr<syn::LitBool>, default: bool| {
        attr.get().map_or(default, |lit| lit.value)
    };
    Some(Spec {
        tool,
        name,
        description: description?,
        effect: effect?,
        idempotent: flag(&attrs.idempotent, false),
        parallel_safe: flag(&attrs.parallel_safe, true),
        confirmation_required,
        access,
        timeout_ms,
        mode,
        register: flag(&attrs.register, true),
        output: output?.0,
        error_span: output?.1,
    })
}

fn check_signature(cx: &Ctxt, tool: &Tool) {
    let sig = &tool.item.sig;
    if sig.asyncness.is_none() {
        cx.error_spanned_by(
            sig.fn_token,
            "a carmy tool must be an `async fn`: write `async fn`",
        );
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        cx.error_spanned_by(
            &sig.generics,
            "a carmy tool cannot be generic: its input and output schemas are fixed at compile \
             time; use concrete types",
        );
    }
    if let Some(receiver) = &tool.receiver {
        cx.error_spanned_by(
            receiver,
            "a carmy tool cannot take `self`: write it as a free function and pass shared \
             values with `carmy::State<T>`",
        );
    }
    let mut input_seen = false;
    let mut context_seen = false;
    for param in &tool.params {
        if let Some(impl_trait) = find_impl_trait(&param.ty) {
            cx.error_spanned_by(
                impl_trait,
                "a carmy tool cannot take `impl Trait` arguments: use a concrete type",
            );
            continue;
        }
        if let Type::Reference(reference) = &param.ty {
            cx.error_spanned_by(
                reference,
                "a carmy tool takes its parameters by value: carmy deserializes an owned input \
                 (use `String` instead of `&str`, `Vec<T>` instead of `&[T]`)",
            );
            continue;
        }
        match &param.kind {
            ParamKind::State(_) => {}
            ParamKind::Context => {
                if context_seen {
                    cx.error_spanned_by(&param.ty, "a carmy tool takes at most one `Context`");
                }
                context_seen = true;
                check_named(cx, &param.pat, "the `Context` parameter");
            }
            ParamKind::Input => {
                if input_seen {
                    cx.error_spanned_by(
                        &param.ty,
                        "a carmy tool takes at most one input: gather the fields in one struct \
                         that derives `Deserialize` and `JsonSchema`",
                    );
                }
                input_seen = true;
                check_named(cx, &param.pat, "the input parameter");
            }
        }
    }
}

/// The input and the context are bound to a name; only `State(x)` may be destructured, so
/// the parameter list reads the same way in every tool.
fn check_named(cx: &Ctxt, pat: &Pat, what: &str) {
    match pat {
        Pat::Ident(ident) if ident.subpat.is_none() && ident.by_ref.is_none() => {}
        Pat::Wild(_) => {}
        _ => cx.error_spanned_by(
            pat,
            format!(
                "{what} must be bound to a name, not a pattern: write `input: T` and \
                 destructure it in the body"
            ),
        ),
    }
}

fn find_impl_trait(ty: &Type) -> Option<&Type> {
    match ty {
        Type::ImplTrait(_) => Some(ty),
        Type::Reference(reference) => find_impl_trait(&reference.elem),
        Type::Paren(paren) => find_impl_trait(&paren.elem),
        Type::Group(group) => find_impl_trait(&group.elem),
        Type::Slice(slice) => find_impl_trait(&slice.elem),
        Type::Array(array) => find_impl_trait(&array.elem),
        Type::Tuple(tuple) => tuple.elems.iter().find_map(find_impl_trait),
        Type::Path(path) => {
            path.path
                .segments
                .iter()
                .find_map(|segment| match &segment.arguments {
                    PathArguments::AngleBracketed(args) => {
                        args.args.iter().find_map(|arg| match arg {
                            GenericArgument::Type(ty) => find_impl_trait(ty),
                            _ => None,
                        })
                    }
                    _ => None,
                })
        }
        _ => None,
    }
}

/// Returns `T` of `Result<T, E>` and the span to blame for `E`.
fn check_return_type<'a>(cx: &Ctxt, tool: &'a Tool) -> Option<(&'a Type, Span)> {
    let sig = &tool.item.sig;
    const HELP: &str = "a carmy tool must return `Result<T, E>` where `T` derives `Serialize` \
                        and `JsonSchema` and `E` converts into `carmy::ToolError`";
    let ty = match &sig.output {
        ReturnType::Default => {
            cx.error_spanned_by(&sig.ident, format!("missing return type: {HELP}"));
            return None;
        }
        ReturnType::Type(_, ty) => ty,
    };
    let result_args = match &**ty {
        Type::Path(path) => path.path.segments.last().and_then(|last| {
            match (last.ident == "Result", &last.arguments) {
                (true, PathArguments::AngleBracketed(args)) => Some(args),
                _ => None,
            }
        }),
        _ => None,
    };
    let Some(args) = result_args else {
        cx.error_spanned_by(ty, HELP);
        return None;
    };
    let mut types = args.args.iter().filter_map(|arg| match arg {
        GenericArgument::Type(ty) => Some(ty),
        _ => None,
    });
    let Some(ok) = types.next() else {
        cx.error_spanned_by(ty, HELP);
        return None;
    };
    let error_span = types.next().map_or_else(|| ty.span(), Spanned::span);
    Some((ok, error_span))
}

fn check_description(cx: &Ctxt, tool: &Tool) -> Option<TokenStream> {
    if let Some(description) = tool.attrs.description.get() {
        if description.value().trim().is_empty() {
            cx.error_spanned_by(description, "`description` must not be empty");
            return None;
        }
        return Some(description.to_token_stream());
    }
    let all_literal_and_blank = tool.docs.iter().all(|doc| match doc {
        Expr::Lit(lit) => matches!(&lit.lit, Lit::Str(s) if s.value().trim().is_empty()),
        _ => false,
    });
    if all_literal_and_blank {
        cx.error_spanned_by(
            &tool.item.sig.ident,
            "a carmy tool needs a description for agents: add a doc comment (`/// …`) or \
             `description = \"…\"`",
        );
        return None;
    }
    let docs = &tool.docs;
    Some(quote!(::core::concat!(#(#docs, "\n"),*)))
}

/// Tool names are 1–128 characters of `[A-Za-z0-9_.-]`.
fn is_valid_tool_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// Parses `"250ms"`, `"30s"`, `"2m"`, `"1h"` into milliseconds; `None` if malformed or zero.
fn parse_duration_ms(text: &str) -> Option<u64> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    let factor = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return None,
    };
    amount.checked_mul(factor).filter(|ms| *ms > 0)
}

fn quoted_list(values: &[&str]) -> String {
    values
        .iter()
        .map(|value| format!("`\"{value}\"`"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("250ms"), Some(250));
        assert_eq!(parse_duration_ms("30s"), Some(30_000));
        assert_eq!(parse_duration_ms("2m"), Some(120_000));
        assert_eq!(parse_duration_ms("1h"), Some(3_600_000));
        for bad in [
            "",
            "ms",
            "30",
            "0s",
            "1.5s",
            "-1s",
            "30 s",
            "30sec",
            "99999999999999999999s",
        ] {
            assert_eq!(parse_duration_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn tool_names() {
        assert!(is_valid_tool_name("create_order"));
        assert!(is_valid_tool_name("shop.orders-v2"));
        assert!(is_valid_tool_name(&"a".repeat(128)));
        assert!(!is_valid_tool_name(""));
        assert!(!is_valid_tool_name(&"a".repeat(129)));
        assert!(!is_valid_tool_name("create order"));
        assert!(!is_valid_tool_name("créer"));
    }
}

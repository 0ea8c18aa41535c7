//! Parsing of the attribute's arguments: `key = literal, …`.
//!
//! Parsing is syntactic and lenient: each key is parsed on its own, a malformed or unknown one is
//! recorded in the [`Ctxt`] and skipped, so one mistake never hides the others. The values are
//! checked in [`crate::check`].

use proc_macro2::{Span, TokenStream};
use syn::parse::{ParseStream, Parser};
use syn::{Expr, ExprLit, Ident, Lit, LitBool, LitStr, Token};

use crate::ctxt::Ctxt;
use crate::symbol::{self, KEYS};

/// A value that may be set once; remembers the key's tokens for error spans.
pub(crate) struct Attr<T> {
    name: &'static str,
    value: Option<(Ident, T)>,
    /// The key was written, even if its value was rejected.
    given: bool,
}

impl<T> Attr<T> {
    fn none(name: &'static str) -> Self {
        Self {
            name,
            value: None,
            given: false,
        }
    }

    fn set(&mut self, cx: &Ctxt, key: Ident, value: T) {
        self.given = true;
        if self.value.is_some() {
            cx.error_spanned_by(&key, format!("duplicate `{}` key", self.name));
        } else {
            self.value = Some((key, value));
        }
    }

    /// Whether the key was written at all (its value may have been rejected).
    pub(crate) fn was_given(&self) -> bool {
        self.given
    }

    /// The value, if the key was given with a valid value.
    pub(crate) fn get(&self) -> Option<&T> {
        self.value.as_ref().map(|(_, value)| value)
    }
}

/// The attribute's arguments as written.
pub(crate) struct Attrs {
    pub(crate) effect: Attr<LitStr>,
    pub(crate) idempotent: Attr<LitBool>,
    pub(crate) parallel_safe: Attr<LitBool>,
    pub(crate) confirmation: Attr<LitStr>,
    pub(crate) access: Attr<LitStr>,
    pub(crate) name: Attr<LitStr>,
    pub(crate) description: Attr<LitStr>,
    pub(crate) timeout: Attr<LitStr>,
    pub(crate) register: Attr<LitBool>,
    pub(crate) mode: Attr<LitStr>,
    /// The span of the whole argument list, for errors about a missing key.
    pub(crate) span: Span,
}

impl Attrs {
    /// Parses the attribute's arguments, recording every error in `cx`.
    pub(crate) fn parse(cx: &Ctxt, args: TokenStream) -> Self {
        let span = if args.is_empty() {
            Span::call_site()
        } else {
            args.clone()
                .into_iter()
                .next()
                .map_or_else(Span::call_site, |token| token.span())
        };
        let mut attrs = Attrs {
            effect: Attr::none(symbol::EFFECT),
            idempotent: Attr::none(symbol::IDEMPOTENT),
            parallel_safe: Attr::none(symbol::PARALLEL_SAFE),
            confirmation: Attr::none(symbol::CONFIRMATION),
            access: Attr::none(symbol::ACCESS),
            name: Attr::none(symbol::NAME),
            description: Attr::none(symbol::DESCRIPTION),
            timeout: Attr::none(symbol::TIMEOUT),
            register: Attr::none(symbol::REGISTER),
            mode: Attr::none(symbol::MODE),
            span,
        };
        let parser = |input: ParseStream<'_>| {
            while !input.is_empty() {
                attrs.parse_one(cx, input)?;
                if input.is_empty() {
                    break;
                }
                input.parse::<Token![,]>()?;
            }
            Ok(())
        };
        if let Err(error) = parser.parse2(args) {
            cx.syn_error(error);
        }
        attrs
    }

    fn parse_one(&mut self, cx: &Ctxt, input: ParseStream<'_>) -> syn::Result<()> {
        let key: Ident = input.call(syn::ext::IdentExt::parse_any)?;
        input.parse::<Token![=]>()?;
        // Any expression parses, so a value of the wrong kind is reported and the next keys
        // are still read.
        let value: Expr = input.parse()?;
        let key_name = key.to_string();
        match key_name.as_str() {
            symbol::EFFECT => set_str(cx, &mut self.effect, key, &value, "\"read\""),
            symbol::IDEMPOTENT => set_bool(cx, &mut self.idempotent, key, &value),
            symbol::PARALLEL_SAFE => set_bool(cx, &mut self.parallel_safe, key, &value),
            symbol::CONFIRMATION => {
                set_str(cx, &mut self.confirmation, key, &value, "\"required\"");
            }
            symbol::ACCESS => set_str(cx, &mut self.access, key, &value, "\"known\""),
            symbol::NAME => set_str(cx, &mut self.name, key, &value, "\"create_order\""),
            symbol::DESCRIPTION => {
                set_str(cx, &mut self.description, key, &value, "\"Place an order\"");
            }
            symbol::TIMEOUT => set_str(cx, &mut self.timeout, key, &value, "\"30s\""),
            symbol::REGISTER => set_bool(cx, &mut self.register, key, &value),
            symbol::MODE => set_str(cx, &mut self.mode, key, &value, "\"async\""),
            unknown => cx.error_spanned_by(&key, unknown_key_message(unknown)),
        }
        Ok(())
    }
}

fn set_str(cx: &Ctxt, attr: &mut Attr<LitStr>, key: Ident, value: &Expr, example: &str) {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => attr.set(cx, key, lit.clone()),
        _ => {
            attr.given = true;
            cx.error_spanned_by(
                value,
                format!(
                    "`{}` takes a string, e.g. `{} = {example}`",
                    attr.name, attr.name
                ),
            );
        }
    }
}

fn set_bool(cx: &Ctxt, attr: &mut Attr<LitBool>, key: Ident, value: &Expr) {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Bool(lit),
            ..
        }) => attr.set(cx, key, lit.clone()),
        _ => {
            attr.given = true;
            cx.error_spanned_by(value, format!("`{}` takes `true` or `false`", attr.name));
        }
    }
}

/// The candidate closest to `written`, if one is close enough to be what was meant.
pub(crate) fn closest<'a>(written: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|candidate| (strsim::jaro_winkler(written, candidate), *candidate))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, candidate)| candidate)
}

fn unknown_key_message(unknown: &str) -> String {
    match closest(unknown, KEYS) {
        Some(key) => format!("unknown key `{unknown}`; did you mean `{key}`?"),
        None => format!(
            "unknown key `{unknown}`; expected one of: {}",
            KEYS.iter()
                .map(|key| format!("`{key}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

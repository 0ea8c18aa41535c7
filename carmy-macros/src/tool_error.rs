//! `#[derive(carmy::ToolError)]`: implements `carmy::IntoToolError` from one
//! `#[tool_error(…)]` attribute per variant (or on a struct), so an error type is mapped to its
//! codes once and converts with `?` in every tool.
//!
//! ```text
//! #[tool_error(code = "OUT_OF_STOCK", category = "conflict", retryable, suggest = "list_products")]
//! #[tool_error(transparent)]      // a one-field variant: the field's own mapping
//! (no attribute)                  // 500 INTERNAL, the `Display` text logged only
//! ```

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::{Attribute, Data, DeriveInput, Fields, Ident, LitInt, LitStr};

use crate::ctxt::Ctxt;

const ATTRIBUTE: &str = "tool_error";
const KEYS: &[&str] = &[
    "code",
    "category",
    "message",
    "retryable",
    "retry_after_secs",
    "suggest",
    "transparent",
];
/// The categories' wire names, which are also `carmy::ToolError`'s constructor names.
const CATEGORIES: &[&str] = &[
    "validation",
    "permission",
    "not_found",
    "conflict",
    "cancelled",
    "internal",
    "capacity",
    "timeout",
];

pub(crate) fn derive(input: TokenStream) -> TokenStream {
    let input: DeriveInput = match syn::parse2(input) {
        Ok(input) => input,
        Err(error) => return error.to_compile_error(),
    };
    let cx = Ctxt::new();
    let arms: Vec<TokenStream> = match &input.data {
        Data::Enum(data) => {
            for attr in input.attrs.iter().filter(|attr| is_ours(attr)) {
                cx.error_spanned_by(attr, "on an enum, `#[tool_error(…)]` goes on each variant");
            }
            data.variants
                .iter()
                .map(|variant| {
                    let ident = &variant.ident;
                    arm(&cx, &quote!(Self::#ident), &variant.attrs, &variant.fields)
                })
                .collect()
        }
        Data::Struct(data) => vec![arm(&cx, &quote!(Self), &input.attrs, &data.fields)],
        Data::Union(_) => {
            cx.error_spanned_by(
                &input.ident,
                "`carmy::ToolError` cannot be derived for a union",
            );
            Vec::new()
        }
    };
    if let Err(error) = cx.check() {
        return error.to_compile_error();
    }
    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    quote! {
        #[automatically_derived]
        impl #impl_generics ::carmy::IntoToolError for #ident #ty_generics #where_clause {
            fn into_tool_error(self) -> ::carmy::ToolError {
                match self {
                    #(#arms)*
                }
            }
        }
    }
}

fn is_ours(attr: &Attribute) -> bool {
    attr.path().is_ident(ATTRIBUTE)
}

/// The attribute as written on one variant.
#[derive(Default)]
struct Mapping<'a> {
    code: Option<LitStr>,
    category: Option<Ident>,
    /// A category was written but is not one (already reported).
    category_invalid: bool,
    message: Option<LitStr>,
    retryable: bool,
    retry_after_secs: Option<LitInt>,
    suggest: Option<LitStr>,
    transparent: Option<Span>,
    /// The attribute, for errors about what it lacks.
    attr: Option<&'a Attribute>,
}

/// One match arm: `pattern => the ToolError`.
fn arm(cx: &Ctxt, path: &TokenStream, attrs: &[Attribute], fields: &Fields) -> TokenStream {
    let mapping = parse(cx, attrs);
    if let Some(span) = mapping.transparent {
        let mut fields = fields.iter();
        let (Some(field), None) = (fields.next(), fields.next()) else {
            cx.syn_error(syn::Error::new(
                span,
                "`transparent` needs exactly one field, whose type implements \
                 `carmy::IntoToolError`",
            ));
            return TokenStream::new();
        };
        let member = match &field.ident {
            Some(ident) => quote!(#ident),
            None => quote!(0),
        };
        return quote! {
            #path { #member: __carmy_inner } => ::carmy::IntoToolError::into_tool_error(__carmy_inner),
        };
    }
    let display = quote!(::std::string::ToString::to_string(&__carmy_this));
    let Some(attr) = mapping.attr else {
        return quote! {
            __carmy_this @ #path { .. } => ::carmy::ToolError::unexpected(#display),
        };
    };
    let Some(category) = &mapping.category else {
        if !mapping.category_invalid {
            cx.error_spanned_by(
                attr,
                format!(
                    "`#[tool_error(…)]` needs a `category`, one of {}",
                    quoted(CATEGORIES)
                ),
            );
        }
        return TokenStream::new();
    };
    let internal = category == "internal";
    let code = match &mapping.code {
        Some(code) => quote!(#code),
        None if internal => quote!("INTERNAL"),
        None => {
            cx.error_spanned_by(
                attr,
                "`#[tool_error(…)]` needs a `code`, e.g. `code = \"OUT_OF_STOCK\"`",
            );
            return TokenStream::new();
        }
    };
    // An internal error's text is for the logs; any other is the agent's message.
    let error = match (&mapping.message, internal) {
        (Some(message), false) => quote!(::carmy::ToolError::#category(#code, #message)),
        (None, false) => quote!(::carmy::ToolError::#category(#code, #display)),
        (Some(message), true) => {
            quote!(::carmy::ToolError::internal(#code, #message).with_source(#display))
        }
        (None, true) => {
            quote!(::carmy::ToolError::internal(#code, "internal error").with_source(#display))
        }
    };
    let retry = match (&mapping.retry_after_secs, mapping.retryable) {
        (Some(secs), _) => quote! {
            .retryable(::core::option::Option::Some(::core::time::Duration::from_secs(#secs)))
        },
        (None, true) => quote!(.retryable(::core::option::Option::None)),
        (None, false) => TokenStream::new(),
    };
    let suggest = mapping.suggest.map(|tool| quote!(.suggest(#tool)));
    quote! {
        __carmy_this @ #path { .. } => #error #retry #suggest,
    }
}

fn parse<'a>(cx: &Ctxt, attrs: &'a [Attribute]) -> Mapping<'a> {
    let mut mapping = Mapping::default();
    for attr in attrs.iter().filter(|attr| is_ours(attr)) {
        if mapping.attr.is_some() {
            cx.error_spanned_by(attr, "duplicate `#[tool_error(…)]` attribute");
            continue;
        }
        mapping.attr = Some(attr);
        let result = attr.parse_nested_meta(|meta| {
            let Some(key) = meta.path.get_ident() else {
                return Err(meta.error("expected a key"));
            };
            let duplicate = || meta.error(format!("duplicate `{key}` key"));
            match key.to_string().as_str() {
                "code" => {
                    let code: LitStr = meta.value()?.parse()?;
                    if code.value().is_empty() {
                        cx.error_spanned_by(&code, "`code` cannot be empty");
                    }
                    set(&mut mapping.code, code).map_err(|()| duplicate())?;
                }
                "category" => {
                    let name: LitStr = meta.value()?.parse()?;
                    if CATEGORIES.contains(&name.value().as_str()) {
                        let ident = Ident::new(&name.value(), name.span());
                        set(&mut mapping.category, ident).map_err(|()| duplicate())?;
                    } else {
                        mapping.category_invalid = true;
                        cx.error_spanned_by(
                            &name,
                            format!(
                                "unknown category `{}`; expected one of {}",
                                name.value(),
                                quoted(CATEGORIES)
                            ),
                        );
                    }
                }
                "message" => {
                    set(&mut mapping.message, meta.value()?.parse()?).map_err(|()| duplicate())?;
                }
                "suggest" => {
                    set(&mut mapping.suggest, meta.value()?.parse()?).map_err(|()| duplicate())?;
                }
                "retry_after_secs" => {
                    let secs: LitInt = meta.value()?.parse()?;
                    secs.base10_parse::<u64>()?;
                    set(&mut mapping.retry_after_secs, secs).map_err(|()| duplicate())?;
                }
                "retryable" => {
                    if std::mem::replace(&mut mapping.retryable, true) {
                        return Err(duplicate());
                    }
                }
                "transparent" => {
                    set(&mut mapping.transparent, key.span()).map_err(|()| duplicate())?;
                }
                unknown => {
                    return Err(meta.error(format!(
                        "unknown key `{unknown}`; expected one of {}",
                        quoted(KEYS)
                    )));
                }
            }
            Ok(())
        });
        if let Err(error) = result {
            cx.syn_error(error);
        }
    }
    if let Some(span) = mapping.transparent {
        let others = mapping.code.is_some()
            || mapping.category.is_some()
            || mapping.message.is_some()
            || mapping.retryable
            || mapping.retry_after_secs.is_some()
            || mapping.suggest.is_some();
        if others {
            cx.syn_error(syn::Error::new(
                span,
                "`transparent` takes the field's own mapping and no other key",
            ));
        }
    }
    mapping
}

/// Sets a key given once; `Err` when it was already set.
fn set<T>(slot: &mut Option<T>, value: T) -> Result<(), ()> {
    match slot {
        Some(_) => Err(()),
        None => {
            *slot = Some(value);
            Ok(())
        }
    }
}

fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|name| format!("`{name}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

//! `#[derive(carmy::JsonSchema)]`: schemars' derive, reached through `carmy`, so a user crate
//! needs no `schemars` dependency.
//!
//! schemars' derive refers to `schemars::…` from where it expands. This derive expands a private
//! copy of the type (same fields and `serde`/`schemars`/doc attributes) inside a block where
//! `schemars` names carmy's re-export, lets schemars derive the copy, and implements the trait
//! for the real type by delegating to the copy.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::punctuated::Punctuated;
use syn::{Attribute, Data, DeriveInput, Fields, Meta, Token, Visibility};

/// Attributes schemars reads, and `cfg` (a gated field exists in the copy exactly when it exists
/// in the type); every other attribute belongs to other derives and is dropped.
const KEPT_ATTRIBUTES: &[&str] = &["doc", "serde", "schemars", "validate", "garde", "cfg"];

pub(crate) fn derive(input: TokenStream) -> TokenStream {
    let input: DeriveInput = match syn::parse2(input) {
        Ok(input) => input,
        Err(error) => return error.to_compile_error(),
    };
    let ident = &input.ident;
    let copy_ident = format_ident!("__CarmySchema{}", ident);

    let mut copy = input.clone();
    copy.ident = copy_ident.clone();
    copy.vis = Visibility::Inherited;
    retain_schema_attributes(&mut copy.attrs);
    let (_, ty_generics, _) = input.generics.split_for_impl();
    let real_default = format!(
        "<{} as ::core::default::Default>::default",
        quote!(#ident #ty_generics)
    );
    let mut container_default = false;
    for attr in &mut copy.attrs {
        match default_from_real_type(attr, &real_default) {
            Ok(rewritten) => container_default |= rewritten,
            Err(error) => return error.to_compile_error(),
        }
    }
    // The schema calls the real type's `Default`, which may need bounds of its own.
    let default_bound =
        (container_default && !input.generics.params.is_empty()).then(|| -> syn::WherePredicate {
            syn::parse_quote!(#ident #ty_generics: ::core::default::Default)
        });
    if let Some(bound) = &default_bound {
        copy.generics
            .make_where_clause()
            .predicates
            .push(bound.clone());
    }
    match &mut copy.data {
        Data::Struct(data) => retain_field_attributes(&mut data.fields),
        Data::Enum(data) => data.variants.iter_mut().for_each(|variant| {
            retain_schema_attributes(&mut variant.attrs);
            retain_field_attributes(&mut variant.fields);
        }),
        Data::Union(data) => data
            .fields
            .named
            .iter_mut()
            .for_each(|field| retain_schema_attributes(&mut field.attrs)),
    }
    // Keep the real type's name in the schema (it shows in `$defs` of recursive types).
    let renamed = input.attrs.iter().any(is_rename);
    let rename = (!renamed && input.generics.params.is_empty()).then(|| {
        let name = ident.to_string();
        quote!(#[schemars(rename = #name)])
    });

    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let mut predicates = where_clause
        .map(|clause| clause.predicates.iter().cloned().collect::<Vec<_>>())
        .unwrap_or_default();
    predicates.extend(default_bound);
    predicates.push(syn::parse_quote!(#copy_ident #ty_generics: schemars::JsonSchema));
    let copy_ty = quote!(<#copy_ident #ty_generics as schemars::JsonSchema>);

    quote! {
        const _: () = {
            use ::carmy::__private::schemars;

            #[derive(schemars::JsonSchema)]
            #rename
            #[allow(dead_code, non_camel_case_types, clippy::all)]
            #copy

            #[automatically_derived]
            impl #impl_generics schemars::JsonSchema for #ident #ty_generics
            where
                #(#predicates),*
            {
                fn schema_name() -> ::std::borrow::Cow<'static, str> {
                    #copy_ty::schema_name()
                }

                fn schema_id() -> ::std::borrow::Cow<'static, str> {
                    #copy_ty::schema_id()
                }

                fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
                    #copy_ty::json_schema(generator)
                }

                fn inline_schema() -> bool {
                    #copy_ty::inline_schema()
                }
            }
        };
    }
}

fn retain_schema_attributes(attrs: &mut Vec<Attribute>) {
    attrs.retain(|attr| is_kept(attr.path()) || is_schema_cfg_attr(attr));
}

fn is_kept(path: &syn::Path) -> bool {
    KEPT_ATTRIBUTES.iter().any(|kept| path.is_ident(kept))
}

/// `#[cfg_attr(predicate, serde(…))]`: kept when everything it adds is kept.
fn is_schema_cfg_attr(attr: &Attribute) -> bool {
    attr.path().is_ident("cfg_attr")
        && attr
            .parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)
            .is_ok_and(|metas| {
                metas.len() > 1 && metas.iter().skip(1).all(|meta| is_kept(meta.path()))
            })
}

fn retain_field_attributes(fields: &mut Fields) {
    fields
        .iter_mut()
        .for_each(|field| retain_schema_attributes(&mut field.attrs));
}

/// A container's `#[serde(default)]` means `Self::default()`, which the copy lacks: it becomes
/// `default = "<Real as Default>::default"`, whose fields are the copy's fields. Whether it
/// rewrote `attr`.
fn default_from_real_type(attr: &mut Attribute, real_default: &str) -> syn::Result<bool> {
    if !attr.path().is_ident("serde") {
        return Ok(false);
    }
    let metas = attr.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)?;
    if !metas
        .iter()
        .any(|meta| matches!(meta, Meta::Path(path) if path.is_ident("default")))
    {
        return Ok(false);
    }
    let metas = metas.into_iter().map(|meta| match meta {
        Meta::Path(path) if path.is_ident("default") => quote!(default = #real_default),
        meta => quote!(#meta),
    });
    *attr = syn::parse_quote!(#[serde(#(#metas),*)]);
    Ok(true)
}

/// Whether a container attribute already renames the type (`#[serde(rename = …)]`,
/// `#[schemars(rename = …)]`).
fn is_rename(attr: &Attribute) -> bool {
    let Meta::List(list) = &attr.meta else {
        return false;
    };
    (list.path.is_ident("serde") || list.path.is_ident("schemars"))
        && list
            .tokens
            .clone()
            .into_iter()
            .any(|token| matches!(token, proc_macro2::TokenTree::Ident(ident) if ident == "rename"))
}

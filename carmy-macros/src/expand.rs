//! Code generation: the user's function unchanged, plus one small shim and a static descriptor.
//!
//! The generated code stays tiny and refers to dependencies only through `::carmy::__private`;
//! the work (validation, schemas, idempotency, transport) lives once in the runtime.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::ItemFn;
use syn::spanned::Spanned;

use crate::ast::{ParamKind, Tool};
use crate::check::{self, Spec};
use crate::ctxt::Ctxt;

/// Entry point: parse → validate → expand. On any error the user's function is still emitted,
/// next to every error found, and nothing is registered.
pub(crate) fn tool(args: TokenStream, item: &TokenStream) -> TokenStream {
    let item_fn: ItemFn = match syn::parse2(item.clone()) {
        Ok(item_fn) => item_fn,
        Err(_) => {
            let error = syn::Error::new(
                Span::call_site(),
                "#[carmy::tool] goes on an `async fn` item",
            );
            let error = error.to_compile_error();
            return quote!(#error #item);
        }
    };
    let cx = Ctxt::new();
    let tool = Tool::parse(&cx, args, item_fn);
    let spec = check::check(&cx, &tool);
    match (cx.check(), spec) {
        (Ok(()), Some(spec)) => expand(&spec),
        (Err(errors), _) => {
            let errors = errors.to_compile_error();
            let item = &tool.item;
            quote!(#item #errors)
        }
        // `check` returns `None` only after recording an error.
        (Ok(()), None) => {
            let item = &tool.item;
            quote!(#item)
        }
    }
}

fn expand(spec: &Spec<'_>) -> TokenStream {
    let Spec {
        tool,
        name,
        description,
        effect,
        idempotent,
        parallel_safe,
        confirmation_required,
        access,
        timeout_ms,
        mode,
        register,
        output,
        error_span,
    } = spec;
    let item = &tool.item;
    let vis = &item.vis;
    let ident = &item.sig.ident;

    let effect = format_ident!("{}", effect);
    let access = format_ident!("{}", access);
    let mode = format_ident!("{}", mode);
    let confirmation = if *confirmation_required {
        quote!(Required)
    } else {
        quote!(None)
    };
    let timeout = match timeout_ms {
        Some(ms) => quote!(::core::option::Option::Some(::core::time::Duration::from_millis(#ms))),
        None => quote!(::core::option::Option::None),
    };

    let mut bindings = Vec::new();
    let mut args = Vec::new();
    let mut states = Vec::new();
    let mut input_schema = quote!(__carmy::no_input_schema);
    for (index, param) in tool.params.iter().enumerate() {
        let arg = format_ident!("__carmy_arg{}", index);
        let ty = &param.ty;
        let span = ty.span();
        bindings.push(match &param.kind {
            ParamKind::Context => quote!(let #arg = __carmy_invocation.context();),
            ParamKind::State(inner) => {
                states.push(quote_spanned!(span=> __carmy::StateRequirement::of::<#inner>()));
                quote_spanned!(span=> let #arg = __carmy::State(__carmy_invocation.state::<#inner>()?);)
            }
            ParamKind::Input => {
                input_schema = quote_spanned!(span=> __carmy::input_schema::<#ty>);
                quote_spanned!(span=> let #arg = __carmy::input::<#ty>(&__carmy_invocation)?;)
            }
        });
        args.push(arg);
    }
    let output_schema = quote_spanned!(output.span()=> __carmy::output_schema::<#output>);
    let ok_value = quote_spanned!(*error_span=> __carmy::ok_or_tool_error(__carmy_result)?);
    let serialize = quote_spanned!(output.span()=> __carmy::serialize_output(&__carmy_value));
    let line = quote_spanned!(ident.span()=> ::core::line!());
    let registration = register.then(|| {
        quote! {
            __carmy::inventory::submit! { __carmy::Registration(#ident::TOOL) }
        }
    });

    quote! {
        #item

        #[doc(hidden)]
        #[allow(non_camel_case_types, dead_code)]
        #vis struct #ident {
            __carmy_private: (),
        }

        const _: () = {
            use ::carmy::__private as __carmy;

            impl #ident {
                /// This tool's descriptor, for `carmy::App::tool` when it is not registered
                /// automatically (`register = false`).
                #[allow(dead_code)]
                pub const TOOL: &'static __carmy::ToolDescriptor = &__CARMY_DESCRIPTOR;
            }

            // A `static`, not a `const`: one address, so the same tool added twice is one tool.
            static __CARMY_DESCRIPTOR: __carmy::ToolDescriptor = __carmy::ToolDescriptor {
                    name: #name,
                    description: #description,
                    effect: __carmy::Effect::#effect,
                    idempotent: #idempotent,
                    parallel_safe: #parallel_safe,
                    confirmation: __carmy::Confirmation::#confirmation,
                    access: __carmy::TrustLevel::#access,
                    timeout: #timeout,
                    mode: __carmy::Mode::#mode,
                    input_schema: #input_schema,
                    output_schema: #output_schema,
                    states: &[#(#states),*],
                    call: __carmy_call,
                    file: ::core::file!(),
                line: #line,
            };

            async fn __carmy_run(
                __carmy_invocation: __carmy::Invocation,
            ) -> ::core::result::Result<__carmy::Output, __carmy::ToolError> {
                #(#bindings)*
                let __carmy_result = #ident(#(#args),*).await;
                let __carmy_value = #ok_value;
                #serialize
            }

            fn __carmy_call(invocation: __carmy::Invocation) -> __carmy::CallFuture {
                ::std::boxed::Box::pin(__carmy_run(invocation))
            }

            #registration
        };
    }
}

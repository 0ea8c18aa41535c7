//! The parsed model of a tool: the attribute's arguments and the function, with the original
//! syntax nodes kept so later steps can point errors at them.

use proc_macro2::TokenStream;
use syn::{Expr, FnArg, GenericArgument, ItemFn, Meta, Pat, PathArguments, Receiver, Type};

use crate::attr::Attrs;
use crate::ctxt::Ctxt;

/// A function annotated with `#[carmy::tool]`.
pub(crate) struct Tool {
    pub(crate) attrs: Attrs,
    pub(crate) item: ItemFn,
    /// The values of the function's `#[doc = …]` attributes, in order.
    pub(crate) docs: Vec<Expr>,
    pub(crate) receiver: Option<Receiver>,
    pub(crate) params: Vec<Param>,
}

/// One typed parameter of the function.
pub(crate) struct Param {
    pub(crate) pat: Pat,
    pub(crate) ty: Type,
    pub(crate) kind: ParamKind,
}

/// What a parameter is, decided by its type.
pub(crate) enum ParamKind {
    /// `carmy::Context`.
    Context,
    /// `carmy::State<T>`, with `T`.
    State(Box<Type>),
    /// Anything else: the tool's input.
    Input,
}

impl Tool {
    /// Parses the attribute arguments and classifies the parameters; never fails.
    pub(crate) fn parse(cx: &Ctxt, args: TokenStream, item: ItemFn) -> Self {
        let attrs = Attrs::parse(cx, args);
        let docs = item
            .attrs
            .iter()
            .filter_map(|attr| match &attr.meta {
                Meta::NameValue(doc) if doc.path.is_ident("doc") => Some(doc.value.clone()),
                _ => None,
            })
            .collect();
        let mut receiver = None;
        let mut params = Vec::new();
        for arg in &item.sig.inputs {
            match arg {
                FnArg::Receiver(self_arg) => receiver = Some(self_arg.clone()),
                FnArg::Typed(typed) => params.push(Param {
                    pat: (*typed.pat).clone(),
                    ty: (*typed.ty).clone(),
                    kind: ParamKind::of(&typed.ty),
                }),
            }
        }
        Tool {
            attrs,
            item,
            docs,
            receiver,
            params,
        }
    }
}

impl ParamKind {
    fn of(ty: &Type) -> Self {
        let Type::Path(path) = ty else {
            return ParamKind::Input;
        };
        let Some(last) = path.path.segments.last() else {
            return ParamKind::Input;
        };
        match (last.ident.to_string().as_str(), &last.arguments) {
            ("Context", PathArguments::None) => ParamKind::Context,
            ("State", PathArguments::AngleBracketed(args)) if args.args.len() == 1 => {
                match args.args.first() {
                    Some(GenericArgument::Type(inner)) => ParamKind::State(Box::new(inner.clone())),
                    _ => ParamKind::Input,
                }
            }
            _ => ParamKind::Input,
        }
    }
}

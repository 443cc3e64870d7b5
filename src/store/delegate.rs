//! One list of the [`Store`] methods, behind every store that forwards to another.

use std::sync::Arc;

use super::Store;

/// Every [`Store`] method, stated once, each body handed to `$dispatch!` with
/// the receiver and a call on the inner store `s` (not awaited): the one list
/// behind `&S` / `Arc<S>` / `Box<S>`, [`delegate_store!`] and the testkit's
/// fault wrapper.
#[doc(hidden)]
#[macro_export]
macro_rules! __store_methods {
    ($($ctx:tt)*) => {
        async fn seen_many(&self, keys: &[&str]) -> $crate::StoreResult<::std::vec::Vec<bool>> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.seen_many(keys))
        }
        async fn remember_many(
            &self,
            keys: &[&str],
            ttl: ::std::option::Option<::std::time::Duration>,
        ) -> $crate::StoreResult<()> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.remember_many(keys, ttl))
        }
        async fn forget(&self, key: &str) -> $crate::StoreResult<()> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.forget(key))
        }
        fn capabilities(&self) -> $crate::store::Capabilities {
            $crate::__store_call!(sync [$($ctx)*]; self, s => s.capabilities())
        }
        fn shared_format(&self) -> ::std::option::Option<&'static str> {
            $crate::__store_call!(sync [$($ctx)*]; self, s => s.shared_format())
        }
        fn fences_commits(&self) -> bool {
            $crate::__store_call!(sync [$($ctx)*]; self, s => s.fences_commits())
        }
        fn kind(&self) -> &'static str {
            $crate::__store_call!(sync [$($ctx)*]; self, s => s.kind())
        }
        async fn peek_many(
            &self,
            keys: &[&str],
        ) -> $crate::StoreResult<::std::vec::Vec<$crate::store::Peeked>> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.peek_many(keys))
        }
        async fn claim_many(
            &self,
            keys: &[&str],
            lease: ::std::time::Duration,
        ) -> $crate::StoreResult<::std::vec::Vec<$crate::store::Claim>> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.claim_many(keys, lease))
        }
        async fn settle(
            &self,
            step: &$crate::store::Settlement<'_>,
        ) -> $crate::StoreResult<$crate::store::Settled> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.settle(step))
        }
        async fn seen(&self, key: &str) -> $crate::StoreResult<bool> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.seen(key))
        }
        async fn remember(
            &self,
            key: &str,
            ttl: ::std::option::Option<::std::time::Duration>,
        ) -> $crate::StoreResult<()> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.remember(key, ttl))
        }
        async fn claim(
            &self,
            key: &str,
            lease: ::std::time::Duration,
        ) -> $crate::StoreResult<$crate::store::Claim> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.claim(key, lease))
        }
        async fn release(&self, key: &str, token: &$crate::store::ClaimToken) -> $crate::StoreResult<()> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.release(key, token))
        }
        async fn renew(
            &self,
            key: &str,
            token: &$crate::store::ClaimToken,
            lease: ::std::time::Duration,
        ) -> $crate::StoreResult<bool> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.renew(key, token, lease))
        }
        async fn remember_fenced(
            &self,
            key: &str,
            token: &$crate::store::ClaimToken,
            ttl: ::std::option::Option<::std::time::Duration>,
        ) -> $crate::StoreResult<bool> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.remember_fenced(key, token, ttl))
        }
    };
}

/// How each `__store_methods!` body reaches the inner store `s`: through a
/// pointer (`deref`), a variant of an enum (`variants`), or a layer (`layer`: a
/// struct whose field `inner` is the store and whose `call(async || ..)` runs
/// each async call, as the testkit's fault injector does).
#[doc(hidden)]
#[macro_export]
macro_rules! __store_call {
    (async [deref]; $self:ident, $s:ident => $call:expr) => {{
        let $s = &**$self;
        $call.await
    }};
    (sync [deref]; $self:ident, $s:ident => $call:expr) => {{
        let $s = &**$self;
        $call
    }};
    (async [variants $enum:ident { $($(#[$attr:meta])* $variant:ident),+ }]; $self:ident, $s:ident => $call:expr) => {
        match $self { $($(#[$attr])* $enum::$variant($s) => $call.await,)+ }
    };
    (sync [variants $enum:ident { $($(#[$attr:meta])* $variant:ident),+ }]; $self:ident, $s:ident => $call:expr) => {
        match $self { $($(#[$attr])* $enum::$variant($s) => $call,)+ }
    };
    (async [layer]; $self:ident, $s:ident => $call:expr) => {
        $self.call(async || {
            let $s = &$self.inner;
            $call.await
        })
        .await
    };
    (sync [layer]; $self:ident, $s:ident => $call:expr) => {{
        let $s = &$self.inner;
        $call
    }};
}

impl<S: Store + ?Sized> Store for &S {
    __store_methods!(deref);
}
impl<S: Store + ?Sized> Store for Arc<S> {
    __store_methods!(deref);
}
impl<S: Store + ?Sized> Store for Box<S> {
    __store_methods!(deref);
}

/// Implements [`Store`] for an enum whose every variant holds one store, by calling
/// the same method on the variant's store: for a "whichever backend was configured"
/// type. A variant may carry `#[cfg(...)]`, as it does in the enum.
///
/// ```
/// use bq_dedupe::{InMemoryStore, store::{PerKey, Unbatched}};
///
/// enum Configured {
///     Plain(InMemoryStore),
///     OneCallPerKey(PerKey<Unbatched<'static, InMemoryStore>>),
/// }
/// bq_dedupe::delegate_store!(Configured { Plain, OneCallPerKey });
/// ```
#[macro_export]
macro_rules! delegate_store {
    ($enum:ident { $($(#[$attr:meta])* $variant:ident),+ $(,)? }) => {
        impl $crate::Store for $enum {
            $crate::__store_methods!(variants $enum { $($(#[$attr])* $variant),+ });
        }
    };
}

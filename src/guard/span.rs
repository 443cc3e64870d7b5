//! The pipeline's telemetry, in one room: a delivery's span started where it is
//! decoded, the handler run inside it, each store call timed as its child, and
//! the span ended with the outcome. Without the `otel` feature, or without
//! [`Guard::with_telemetry`], every step here is a no-op.

use super::*;

/// A delivery's span (feature `otel`, with [`Guard::with_telemetry`]); empty
/// otherwise. Carried in its [`Decision`] from decode to outcome.
#[derive(Clone, Default)]
pub struct DeliverySpan {
    #[cfg(feature = "otel")]
    inner: Option<(opentelemetry::Context, Mode)>,
}

impl DeliverySpan {
    /// Does it carry a span?
    pub fn is_recording(&self) -> bool {
        #[cfg(feature = "otel")]
        return self.inner.is_some();
        #[cfg(not(feature = "otel"))]
        false
    }

    /// The mode the span reports (set where a transactional path starts).
    pub(super) fn set_mode(&mut self, mode: Mode) {
        #[cfg(feature = "otel")]
        if let Some((_, m)) = &mut self.inner {
            *m = mode;
        }
        let _ = mode;
    }
}

/// Spans never make two decisions differ.
impl PartialEq for DeliverySpan {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for DeliverySpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_recording() {
            "DeliverySpan(recording)"
        } else {
            "DeliverySpan(none)"
        })
    }
}

impl<S: Store, O: Observer, T: Timer> Guard<S, O, T> {
    /// Starts a delivery's span (`message`: `None` for a body that did not decode).
    pub(super) fn start_span<B: Body + ?Sized>(
        &self,
        body: &B,
        message: Option<&Message<'_>>,
    ) -> DeliverySpan {
        #[cfg(feature = "otel")]
        if let Some(telemetry) = &self.telemetry {
            let mode = match self.options.claim_lease {
                Some(_) => Mode::Claiming,
                None => Mode::SeenSet,
            };
            let fields = match message {
                Some(message) => crate::telemetry::Fields::of(message),
                None => crate::telemetry::Fields::lenient(body.raw()),
            };
            let cx = telemetry.start_delivery(&fields, body.trace_headers());
            return DeliverySpan {
                inner: Some((cx, mode)),
            };
        }
        let _ = (body, message);
        DeliverySpan::default()
    }

    /// One store call, timed and traced: `op` carrying `keys` keys for the
    /// deliveries whose spans are `spans`.
    #[cfg(feature = "otel")]
    pub(super) async fn store_call<'s, R>(
        &self,
        op: &'static str,
        keys: usize,
        spans: impl IntoIterator<Item = &'s DeliverySpan>,
        call: impl Future<Output = StoreResult<R>>,
    ) -> StoreResult<R> {
        let traced = self.start_store_call(op, keys, spans);
        let result = call.await;
        end_store_call(traced, &result);
        result
    }

    /// Without `otel`, the call itself: no wrapper, no cost.
    #[cfg(not(feature = "otel"))]
    #[inline(always)]
    pub(super) fn store_call<'s, F>(
        &self,
        _op: &'static str,
        _keys: usize,
        _spans: impl IntoIterator<Item = &'s DeliverySpan>,
        call: F,
    ) -> F {
        call
    }

    /// [`Guard::store_call`] for a synchronous call (a database transaction
    /// with the handler inside).
    pub(super) fn store_call_sync<'s, R>(
        &self,
        op: &'static str,
        keys: usize,
        spans: impl IntoIterator<Item = &'s DeliverySpan>,
        call: impl FnOnce() -> StoreResult<R>,
    ) -> StoreResult<R> {
        #[cfg(feature = "otel")]
        {
            let traced = self.start_store_call(op, keys, spans);
            let result = call();
            end_store_call(traced, &result);
            result
        }
        #[cfg(not(feature = "otel"))]
        {
            let _ = (op, keys, spans.into_iter());
            call()
        }
    }

    /// A store call's span, under the deliveries whose spans are `spans`
    /// (`None`: the guard has no telemetry).
    #[cfg(feature = "otel")]
    fn start_store_call<'s>(
        &self,
        op: &'static str,
        keys: usize,
        spans: impl IntoIterator<Item = &'s DeliverySpan>,
    ) -> Option<(
        &crate::telemetry::otel::Telemetry,
        crate::telemetry::otel::StoreCall,
    )> {
        let telemetry = self.telemetry.as_deref()?;
        let parents: Vec<&opentelemetry::Context> = spans
            .into_iter()
            .filter_map(|s| s.inner.as_ref().map(|(cx, _)| cx))
            .collect();
        Some((
            telemetry,
            telemetry.store_call(op, self.store.kind(), keys, &parents),
        ))
    }

    /// Records a batch's size.
    pub(super) fn observe_batch(&self, size: usize) {
        #[cfg(feature = "otel")]
        if let Some(telemetry) = &self.telemetry {
            telemetry.batch(size);
        }
        let _ = size;
    }

    /// Ends a delivery's span with its outcome.
    pub(super) fn end_span<E>(&self, decision: &Decision, outcome: &Outcome<E>) {
        #[cfg(feature = "otel")]
        if let (Some(telemetry), Some((cx, mode))) = (&self.telemetry, &decision.span.inner) {
            let claimed = decision.claim.is_some();
            // The guard cannot print any `E`: a failed handler's span says
            // `failed` unless the host adds its error.
            let reason = outcome.reason_by(|_| None);
            let end = crate::telemetry::otel::Ended {
                kind: outcome.kind(),
                mode: *mode,
                claimed,
                duplicate: matches!(decision.verdict, Verdict::Duplicate(_)),
                reason,
                error_type: match outcome {
                    Outcome::Panicked(_) => Some("panic"),
                    Outcome::Failed(_) | Outcome::FailOpen(Err(_)) => {
                        Some(std::any::type_name::<E>())
                    }
                    _ => None,
                },
            };
            telemetry.end_delivery(cx, end);
        }
        let _ = (decision, outcome);
    }
}

/// Runs `future` (a handler) with the delivery's span current, so the
/// handler's own spans are its children.
#[cfg(feature = "otel")]
pub(super) async fn in_span<F: Future>(span: &DeliverySpan, future: F) -> F::Output {
    use opentelemetry::context::FutureExt;
    match &span.inner {
        Some((cx, _)) => future.with_context(cx.clone()).await,
        None => future.await,
    }
}

/// Without `otel`, the handler's future itself.
#[cfg(not(feature = "otel"))]
#[inline(always)]
pub(super) fn in_span<F: Future>(_span: &DeliverySpan, future: F) -> F {
    future
}

/// Runs a synchronous handler with the delivery's span current.
pub(super) fn in_span_sync<R>(span: &DeliverySpan, call: impl FnOnce() -> R) -> R {
    #[cfg(feature = "otel")]
    if let Some((cx, _)) = &span.inner {
        let _current = cx.clone().attach();
        return call();
    }
    let _ = span;
    call()
}

// A span is only ever ended, never read back mid-unwind: a decision holding
// one stays as unwind-safe as one without (so `otel` in the build changes no
// caller's `catch_unwind`).
impl std::panic::UnwindSafe for DeliverySpan {}
impl std::panic::RefUnwindSafe for DeliverySpan {}

/// Ends a store call's span with its result.
#[cfg(feature = "otel")]
fn end_store_call<R>(
    traced: Option<(
        &crate::telemetry::otel::Telemetry,
        crate::telemetry::otel::StoreCall,
    )>,
    result: &StoreResult<R>,
) {
    if let Some((telemetry, call)) = traced {
        let error = result.as_ref().err().map(|e| e as &dyn std::fmt::Display);
        telemetry.end_store_call(call, error);
    }
}

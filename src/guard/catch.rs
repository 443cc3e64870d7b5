//! Running the handler: only when told to, and with a panic caught so it never
//! crosses the guard.

use super::*;

/// Runs the handler if the decision says so; `None` when it must not run.
pub(super) async fn run_if_told<E>(
    handler: &mut impl AsyncFnMut(&Message<'_>) -> Result<(), E>,
    message: Option<&Message<'_>>,
    decision: &Decision,
) -> Option<HandlerResult<E>> {
    match message {
        Some(msg) if decision.should_run() => Some(run_caught(handler, msg, &decision.span).await),
        _ => None,
    }
}

/// Runs the handler, turning a panic (where unwinding exists) into a result so it
/// never crosses the guard.
pub(super) async fn run_caught<E>(
    handler: &mut impl AsyncFnMut(&Message<'_>) -> Result<(), E>,
    msg: &Message<'_>,
    span: &DeliverySpan,
) -> HandlerResult<E> {
    match caught(span::in_span(span, async { handler(msg).await })).await {
        Ok(result) => result.into(),
        Err(panic) => HandlerResult::Panicked(panic),
    }
}

/// Drives `future`, a panic in any poll (where unwinding exists) answered as
/// its message. Pass an `async` block around the call, so a panic in the
/// synchronous part of the call is caught too.
pub(super) async fn caught<F: Future>(future: F) -> Result<F::Output, String> {
    let mut call = pin!(future);
    std::future::poll_fn(move |cx| {
        match std::panic::catch_unwind(AssertUnwindSafe(|| call.as_mut().poll(cx))) {
            Ok(Poll::Ready(r)) => Poll::Ready(Ok(r)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready(Err(panic_message(&*payload))),
        }
    })
    .await
}

pub(super) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

// A delivery's span through the Workers runtime's own tracing API, so it shows
// in Workers' traces: `tracing.enterSpan` ends its span when the callback's
// promise settles, so the callback hands back a promise that `close` settles.
// Nothing here throws: a runtime without the API, or one that refuses an
// attribute, loses the span, never the delivery.
// A namespace import: a runtime whose module has no `tracing` export still
// loads the worker (a named import would fail to link).
import * as workers from "cloudflare:workers";

/** An open span, or `undefined` where the runtime traces nothing (`isTraced` false). */
export function openSpan(name) {
  try {
    let span;
    let close;
    const closed = workers.tracing.enterSpan(name, (s) => {
      span = s;
      return new Promise((resolve) => (close = resolve));
    });
    Promise.resolve(closed).catch(() => {});
    if (span?.isTraced) return new OpenSpan(span, close);
    close?.();
  } catch {
    // no tracing API here
  }
  return undefined;
}

class OpenSpan {
  constructor(span, close) {
    this.span = span;
    this.done = close;
  }

  set(key, value) {
    try {
      this.span.setAttribute(key, value);
    } catch {
      // an attribute the runtime refuses
    }
  }

  close() {
    this.done();
  }
}

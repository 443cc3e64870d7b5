//! The `DedupeShard` Durable Object: one shard of the seen-set, on SQLite.

// `#[durable_object]` generates the undocumented JS-facing methods (`new`,
// `fetch`, `alarm`, ...) in this module.
#![allow(missing_docs)]

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use wasm_bindgen::JsValue;
use wasm_bindgen::prelude::*;
use worker::{DurableObject, Env, Request, Response, Result, ScheduledTime, State, durable_object};

use super::protocol::ShardRequest;
use super::table::{Applied, IdTable};

#[wasm_bindgen]
extern "C" {
    /// The Durable Object storage, for the one method worker 0.8.7 does not bind.
    #[wasm_bindgen(extends = js_sys::Object)]
    type TransactionalStorage;

    /// `storage.transactionSync(fn)`: runs `fn` in one SQLite transaction, rolled
    /// back if it throws.
    #[wasm_bindgen(method, catch, js_name = transactionSync)]
    fn transaction_sync(
        this: &TransactionalStorage,
        body: &js_sys::Function,
    ) -> std::result::Result<JsValue, JsValue>;
}

/// One shard of the seen-set. Bind it with `new_sqlite_classes` (see the README).
#[durable_object]
#[derive(Debug)]
pub struct DedupeShard {
    state: State,
    table: IdTable,
    schema_ready: Cell<bool>,
    /// The sweep alarm this instance knows is set (absolute ms).
    alarm_at: Cell<Option<i64>>,
}

// Built with `worker-build --panic-unwind`, workers-rs and wasm-bindgen catch a
// panic at each entry point, which asks the object (its `Cell`s) to be unwind
// safe. Its cells hold a cache (the schema made, the alarm set): a panic
// halfway through a request leaves at worst one more `CREATE ... IF NOT EXISTS`
// or alarm write, and the table's writes run in a transaction a throw rolls back.
impl std::panic::RefUnwindSafe for DedupeShard {}
impl std::panic::UnwindSafe for DedupeShard {}

impl DedupeShard {
    /// The choices the shard's rows make in the core's record model (a lapsed
    /// claim stays its owner's until taken over; a done row keeps the token
    /// that committed it): what the store testkit checks the shard against.
    pub const RULES: bq_dedupe::store::record::Rules = super::table::RULES;
}

impl DurableObject for DedupeShard {
    fn new(state: State, _env: Env) -> Self {
        let table = IdTable::new(state.storage().sql());
        DedupeShard {
            state,
            table,
            schema_ready: Cell::new(false),
            alarm_at: Cell::new(None),
        }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        let request: ShardRequest = match req.json().await {
            Ok(request) => request,
            Err(e) => return Response::error(format!("dedupe shard: bad request: {e}"), 400),
        };
        match self.apply_atomically(request) {
            Ok((reply, expiry)) => {
                // The writes are committed; a sweep that cannot be scheduled only
                // delays reclaiming space (reads check expiry themselves), so it must
                // not fail a request whose claims were taken.
                if let Some(at) = expiry
                    && let Err(e) = self.schedule_sweep(at).await
                {
                    worker::console_error!("dedupe shard: scheduling the sweep: {e}");
                }
                Response::from_json(&reply)
            }
            Err(e) => Response::error(format!("dedupe shard: {e}"), 500),
        }
    }

    async fn alarm(&self) -> Result<Response> {
        self.ensure_schema()?;
        self.alarm_at.set(None);
        if let Some(next) = self.table.sweep(now_ms())? {
            self.schedule_sweep(next).await?;
        }
        Response::ok("swept")
    }
}

impl DedupeShard {
    fn ensure_schema(&self) -> Result<()> {
        if !self.schema_ready.get() {
            self.table.create()?;
            self.schema_ready.set(true);
        }
        Ok(())
    }

    /// Applies a request in one transaction: synchronous (no other request
    /// interleaves, so a batch's check-and-claim is atomic) and all-or-nothing (an
    /// error halfway, such as a full database, leaves no claim behind).
    fn apply_atomically(&self, request: ShardRequest) -> Result<Applied> {
        self.ensure_schema()?;
        let table = self.table.clone();
        let now = now_ms();
        let outcome: Rc<RefCell<Option<Result<Applied>>>> = Rc::default();
        let slot = Rc::clone(&outcome);
        // Unwind safe (for `--panic-unwind`): a panic inside leaves `slot`
        // empty, which reads as the transaction failing.
        let body = Closure::once_into_js(std::panic::AssertUnwindSafe(
            move || -> std::result::Result<(), JsValue> {
                let result = table.apply(request, now);
                // Throwing is what rolls the transaction back.
                let thrown = result
                    .as_ref()
                    .err()
                    .map(|e| JsValue::from_str(&e.to_string()));
                *slot.borrow_mut() = Some(result);
                thrown.map_or(Ok(()), Err)
            },
        ));
        let storage = self.state.storage();
        let storage: &TransactionalStorage = storage.as_raw().unchecked_ref();
        let committed = storage.transaction_sync(body.unchecked_ref());
        match (outcome.borrow_mut().take(), committed) {
            (Some(Ok(applied)), Ok(_)) => Ok(applied),
            (Some(Err(e)), _) => Err(e),
            (_, Err(e)) => Err(worker::Error::from(e)),
            (None, Ok(_)) => Err(worker::Error::RustError(
                "transactionSync did not run the request".into(),
            )),
        }
    }

    /// Makes sure an alarm fires no later than `at` to sweep expired rows.
    async fn schedule_sweep(&self, at: i64) -> Result<()> {
        if self.alarm_at.get().is_some_and(|set| set <= at) {
            return Ok(());
        }
        let storage = self.state.storage();
        match storage.get_alarm().await? {
            Some(set) if set <= at => self.alarm_at.set(Some(set)),
            _ => {
                let when = js_sys::Date::new(&wasm_bindgen::JsValue::from_f64(at as f64));
                storage.set_alarm(ScheduledTime::new(when)).await?;
                self.alarm_at.set(Some(at));
            }
        }
        Ok(())
    }
}

fn now_ms() -> i64 {
    js_sys::Date::now() as i64
}

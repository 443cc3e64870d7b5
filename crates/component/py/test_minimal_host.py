"""A host in Python (wasmtime-py) for the `dedupe-minimal` component.

The host provides four functions: `seen-set`'s `seen`, `remember` and `forget`
over a dict, and `handler.handle`. Run by scripts/python-host-test.sh:

    python -m unittest discover -s crates/component/py -v

with BQ_MINIMAL_COMPONENT naming the component file.
"""

import json
import os
import unittest

from wasmtime import Engine, Store
from wasmtime.component import Component, Linker, Record, ResourceAny

PACKAGE = "babelqueue:idempotency"
VERSION = "1.1.0"


def iface(name):
    return f"{PACKAGE}/{name}@{VERSION}"


def record(**fields):
    """A WIT record: field names are kebab-case (`ttl_ms` -> `ttl-ms`)."""
    r = Record()
    for name, value in fields.items():
        setattr(r, name.replace("_", "-"), value)
    return r


def store_error(kind, message):
    return record(kind=kind, message=message)


def envelope(id, order=1):
    return json.dumps(
        {
            "job": "urn:babel:orders:created",
            "trace_id": "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b",
            "data": {"order": order},
            "meta": {"id": id, "schema_version": 1},
        }
    )


class Host:
    """The seen-set and the handler, with what the guest asked of them."""

    def __init__(self, component_path):
        self.keys = {}  # key -> ttl-ms it was remembered with
        self.calls = []  # (function, key) in call order
        self.handled = []  # envelope texts the handler ran
        self.fail = set()  # ids whose handler fails
        self.store_down = False
        engine = Engine()
        self.store = Store(engine)
        linker = Linker(engine)
        with linker.root() as root:
            with root.add_instance(iface("seen-set")) as seen_set:
                seen_set.add_func("seen", self.seen)
                seen_set.add_func("remember", self.remember)
                seen_set.add_func("forget", self.forget)
            with root.add_instance(iface("handler")) as handler:
                handler.add_func("handle", self.handle)
        component = Component.from_file(engine, component_path)
        self.imports = set(component.type.imports(engine))
        self.instance = linker.instantiate(self.store, component)

    # --- seen-set ---------------------------------------------------------
    # wasmtime-py passes a `result` whose two cases hold different Python types
    # as the value itself: `result<bool, store-error>` is a bool or a record,
    # `result<_, store-error>` is None or a record, `result<_, string>` None or
    # the reason.

    def seen(self, _store, key):
        self.calls.append(("seen", key))
        if self.store_down:
            return store_error("unavailable", "the seen-set is down")
        return key in self.keys

    def remember(self, _store, key, ttl_ms):
        self.calls.append(("remember", key))
        if self.store_down:
            return store_error("unavailable", "the seen-set is down")
        self.keys[key] = ttl_ms
        return None

    def forget(self, _store, key):
        self.calls.append(("forget", key))
        self.keys.pop(key, None)
        return None

    # --- handler ------------------------------------------------------------

    def handle(self, _store, text):
        msg_id = json.loads(text)["meta"]["id"]
        if msg_id in self.fail:
            return f"handler failed for {msg_id}"
        self.handled.append(text)
        return None

    # --- the exports ----------------------------------------------------------

    def func(self, interface, name):
        where = self.instance.get_export_index(self.store, iface(interface))
        index = self.instance.get_export_index(self.store, name, where)
        func = self.instance.get_func(self.store, index)
        assert func is not None, f"{interface} exports no {name}"
        return func

    def call(self, interface, name, *args):
        func = self.func(interface, name)
        result = func(self.store, *args)
        func.post_return(self.store)
        return result

    def guard(self, **options):
        fields = dict(
            ttl_ms=None,
            claim_lease_ms=None,
            key_prefix="bq:",
            key_scope=None,
            max_bytes=None,
            fingerprint=False,
        )
        fields.update(options)
        return self.call("consumer", "[constructor]guard", record(**fields))

    def process_batch(self, guard, envelopes):
        return self.call("consumer", "[method]guard.process-batch", guard, envelopes)


def tags(outcomes):
    return [o.tag for o in outcomes]


class MinimalHostTest(unittest.TestCase):
    def setUp(self):
        path = os.environ.get("BQ_MINIMAL_COMPONENT")
        self.assertTrue(path, "BQ_MINIMAL_COMPONENT names the component to test")
        self.host = Host(path)

    def open_guard(self, **options):
        # `result<guard, store-error>` is untagged: the resource, or the record.
        built = self.host.guard(**options)
        self.assertIsInstance(built, ResourceAny, f"the constructor failed: {vars(built)}")
        return built

    def test_the_component_imports_only_the_seen_set_and_the_handler(self):
        # setUp instantiated it with these four functions defined and no others.
        self.assertEqual(
            self.host.imports, {iface("types"), iface("seen-set"), iface("handler")}
        )

    def test_a_redelivery_is_skipped_and_a_failure_runs_again(self):
        guard = self.open_guard(ttl_ms=60_000)
        self.host.fail.add("b")
        first = self.host.process_batch(guard, [envelope("a"), envelope("b")])
        self.assertEqual(tags(first), ["run-ok", "run-failed"])
        self.assertEqual(self.host.keys, {"bq:a": 60_000})

        self.host.fail.clear()
        again = self.host.process_batch(
            guard, [envelope("a"), envelope("b"), envelope("b")]
        )
        self.assertEqual(tags(again), ["skip", "run-ok", "skip"])
        ran = [json.loads(t)["meta"]["id"] for t in self.host.handled]
        self.assertEqual(ran, ["a", "b"])

    def test_a_batch_asks_the_seen_set_once_per_distinct_key(self):
        guard = self.open_guard()
        self.host.process_batch(guard, [envelope("x"), envelope("y"), envelope("x")])
        self.assertEqual(
            self.host.calls,
            [("seen", "bq:x"), ("seen", "bq:y"), ("remember", "bq:x"), ("remember", "bq:y")],
        )

    def test_forget_makes_an_id_run_again(self):
        guard = self.open_guard()
        self.host.process_batch(guard, [envelope("f")])
        forgot = self.host.call("consumer", "[method]guard.forget", guard, "f")
        self.assertIsNone(forgot)
        self.assertNotIn("bq:f", self.host.keys)
        self.assertEqual(tags(self.host.process_batch(guard, [envelope("f")])), ["run-ok"])

    def test_bad_input_is_rejected_and_a_store_failure_runs_nothing(self):
        guard = self.open_guard()
        [rejected] = self.host.process_batch(guard, ['{"job": 1'])
        self.assertEqual(rejected.tag, "rejected")

        self.host.store_down = True
        [down] = self.host.process_batch(guard, [envelope("s")])
        self.assertEqual(down.tag, "store-unavailable")
        self.assertEqual(down.payload.kind, "unavailable")
        self.assertEqual(self.host.handled, [])

    def test_claiming_mode_is_refused_without_running(self):
        guard = self.open_guard(claim_lease_ms=30_000)
        [refused] = self.host.process_batch(guard, [envelope("c")])
        self.assertEqual(refused.tag, "store-unavailable")
        self.assertEqual(refused.payload.kind, "unsupported")
        self.assertEqual(self.host.handled, [])
        self.assertEqual(self.host.keys, {})

    def test_payload_fingerprints_work_over_the_seen_set(self):
        guard = self.open_guard(fingerprint=True)
        self.assertEqual(tags(self.host.process_batch(guard, [envelope("p", 1)])), ["run-ok"])
        same = self.host.process_batch(guard, [envelope("p", 1)])
        other = self.host.process_batch(guard, [envelope("p", 2)])
        self.assertEqual(tags(same), ["skip"])
        self.assertEqual(tags(other), ["payload-mismatch"])


if __name__ == "__main__":
    unittest.main()

//! One pass of 1,000,000 deliveries (20 % redeliveries) through `Guard::process`
//! (`process`), or through `Guard::process_batch` in chunks of 100 (`batch`), or
//! neither (`none`: the cost of making the lines): the program
//! `bench/instructions.sh` counts the instructions of, under valgrind, for two
//! revisions of the core. Instruction counts, unlike times on a shared machine,
//! repeat to within 0.01 %.
use bq_dedupe::{Guard, InMemoryStore, block_on_ready};
use std::convert::Infallible;

fn main() {
    let n = 1_000_000usize;
    let lines: Vec<String> = (0..n)
        .map(|i| {
            let id = if i % 5 == 4 { i - 3 } else { i };
            format!(r#"{{"job":"urn:babel:orders:created","trace_id":"6f1c2a9e-1b7d-4c1e-9a55-{id:012}","data":{{"order_id":{id},"sku":"SKU-{id}"}},"meta":{{"id":"order-{id}","schema_version":1,"queue":"orders"}},"attempts":0}}"#)
        })
        .collect();
    let mode = std::env::args().nth(1).unwrap_or_default();
    let guard = Guard::new(InMemoryStore::new());
    let mut ran = 0u64;
    if mode == "batch" {
        for chunk in lines.chunks(100) {
            let out = block_on_ready(guard.process_batch(chunk, async |_m| {
                ran += 1;
                Ok::<(), Infallible>(())
            }))
            .unwrap();
            std::hint::black_box(out);
        }
    } else if mode == "process" {
        for line in &lines {
            let out = block_on_ready(guard.process(line.as_bytes(), async |_m| {
                ran += 1;
                Ok::<(), Infallible>(())
            }))
            .unwrap();
            std::hint::black_box(out);
        }
    }
    println!("{mode}: ran {ran}");
}

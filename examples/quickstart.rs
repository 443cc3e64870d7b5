use bq_dedupe::{Disposition, Guard, InMemoryStore, Message, block_on_ready};

fn main() {
    let guard = Guard::new(InMemoryStore::new()); // or a bq_dedupe_stores::SqliteStore, ...
    let body = include_bytes!("minimal-envelope.json");
    for delivery in 1..=2 {
        let outcome = block_on_ready(guard.process(body, async |msg: &Message<'_>| {
            let data: serde_json::Value = msg.data().map_err(|e| e.to_string())?; // or your own type
            println!("charging order {}", data["order_id"]); // your side effect
            Ok::<(), String>(())
        }))
        .expect("a synchronous store completes at once"); // async hosts just .await
        println!("delivery {delivery}: {}", outcome.kind().code()); // run-ok, then skip
        match outcome.disposition() {
            Disposition::Ack => {}    // acknowledge the message
            Disposition::Retry => {}  // let the queue redeliver it
            Disposition::Poison => {} // dead-letter it
        }
    }
}

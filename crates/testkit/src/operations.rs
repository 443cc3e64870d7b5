//! The operations of a run: [`Op`], one step (a store call from one client,
//! the clock moving, a client crashing, a fault armed), the keys a run uses,
//! and the steps' random generation ([`ops`]: calls weighted towards claims,
//! batches of distinct keys, only what the store's capabilities offer);
//! [`as_rust`] prints a run to paste into a test.

use bq_dedupe::store::Capabilities;
use proptest::prelude::*;

use crate::fault::Fault;

/// The keys a run uses: canonical UUIDs (which some stores hold as bytes) and
/// other text.
pub(crate) const KEYS: [&str; 4] = [
    "60a7c782-d326-426c-876e-7fc44dd0bb78",
    "order:1042",
    "f10f5e1a-01ba-4956-9582-8a4511ed9ff8",
    "F10F5E1A-01BA-4956-9582-8A4511ED9FF8",
];

/// One step of a run. Keys are indexes into the run's keys, clients into its
/// clients; `token` picks one of the tokens the client was given for that key
/// (old ones included), or a token never issued if it has none; times are in
/// the harness's ticks.
#[derive(Debug, Clone)]
#[allow(missing_docs)] // the fields are the ones the enum's docs describe
pub enum Op {
    /// `seen` (one key) or `seen_many`.
    Seen { client: usize, keys: Vec<usize> },
    /// `peek_many`.
    Peek { client: usize, keys: Vec<usize> },
    /// `remember` (one key) or `remember_many`.
    Remember {
        client: usize,
        keys: Vec<usize>,
        ttl: Option<u64>,
    },
    /// `forget`.
    Forget { client: usize, key: usize },
    /// `claim` (one key) or `claim_many`.
    Claim {
        client: usize,
        keys: Vec<usize>,
        lease: u64,
    },
    /// `renew`.
    Renew {
        client: usize,
        key: usize,
        token: usize,
        lease: u64,
    },
    /// `release`.
    Release {
        client: usize,
        key: usize,
        token: usize,
    },
    /// `remember_fenced`.
    Commit {
        client: usize,
        key: usize,
        token: usize,
        ttl: Option<u64>,
    },
    /// `settle`: each key released, renewed or remembered (fenced with
    /// `Some(token)`, plainly with `None`).
    Settle {
        client: usize,
        release: Vec<(usize, usize)>,
        renew: Vec<(usize, usize)>,
        remember: Vec<(usize, Option<usize>)>,
        ttl: Option<u64>,
        lease: u64,
    },
    /// A transaction on one key (the transactional mode) whose work writes one
    /// effect row, then succeeds (`ok`) or fails; `claim`, which of the
    /// client's tokens for the key it passes as its own claim (where the mode
    /// takes one).
    Transact {
        client: usize,
        key: usize,
        claim: Option<usize>,
        ttl: Option<u64>,
        ok: bool,
    },
    /// The clock moves on.
    Advance { ticks: u64 },
    /// The client crashes and is opened again, knowing no tokens.
    Crash { client: usize },
    /// The client's next call meets `fault`.
    Arm { client: usize, fault: Fault },
}

/// Random runs of `Op`s for a store with `caps`, over `clients` clients
/// (transactions too, for a `transactional` one; with the client's claims for
/// one whose transactions `take_claims`).
pub fn ops(
    caps: Capabilities,
    clients: usize,
    transactional: bool,
    take_claims: bool,
) -> impl Strategy<Value = Vec<Op>> {
    let client = 0..clients.max(1);
    let key = 0..KEYS.len();
    let keys = prop::sample::subsequence((0..KEYS.len()).collect::<Vec<_>>(), 1..=KEYS.len())
        .prop_shuffle();
    let ttl = move || {
        prop_oneof![Just(None), (1u64..4).prop_map(Some), Just(Some(12)),]
            .prop_filter("a TTL needs the capability", move |t| {
                t.is_none() || caps.ttl
            })
    };
    let lease = || prop_oneof![1u64..4, Just(12u64)];
    let token = || 0usize..3;
    let fault = prop_oneof![Just(Fault::Before), Just(Fault::After), Just(Fault::Resend)];
    let mut choices: Vec<BoxedStrategy<Op>> = vec![
        (client.clone(), keys.clone())
            .prop_map(|(client, keys)| Op::Seen { client, keys })
            .boxed(),
        (client.clone(), keys.clone(), ttl())
            .prop_map(|(client, keys, ttl)| Op::Remember { client, keys, ttl })
            .boxed(),
        (client.clone(), keys.clone())
            .prop_map(|(client, keys)| Op::Peek { client, keys })
            .boxed(),
        (client.clone(), key.clone())
            .prop_map(|(client, key)| Op::Forget { client, key })
            .boxed(),
        (1u64..5).prop_map(|ticks| Op::Advance { ticks }).boxed(),
        client
            .clone()
            .prop_map(|client| Op::Crash { client })
            .boxed(),
        (client.clone(), fault)
            .prop_map(|(client, fault)| Op::Arm { client, fault })
            .boxed(),
    ];
    if transactional {
        let claim = match take_claims {
            true => prop::option::of(token()).boxed(),
            false => Just(None).boxed(),
        };
        let transact = (
            client.clone(),
            key.clone(),
            claim,
            ttl(),
            prop::bool::weighted(0.75),
        )
            .prop_map(|(client, key, claim, ttl, ok)| Op::Transact {
                client,
                key,
                claim,
                ttl,
                ok,
            })
            .boxed();
        choices.push(transact.clone());
        choices.push(transact);
    }
    if caps.claim {
        let claim = (client.clone(), keys.clone(), lease())
            .prop_map(|(client, keys, lease)| Op::Claim {
                client,
                keys,
                lease,
            })
            .boxed();
        // Twice: most rules are about claims, so runs take more of them.
        choices.push(claim.clone());
        choices.push(claim);
        choices.push(
            (client.clone(), key.clone(), token())
                .prop_map(|(client, key, token)| Op::Release { client, key, token })
                .boxed(),
        );
    }
    if caps.claim && caps.renew {
        choices.push(
            (client.clone(), key.clone(), token(), lease())
                .prop_map(|(client, key, token, lease)| Op::Renew {
                    client,
                    key,
                    token,
                    lease,
                })
                .boxed(),
        );
        choices.push(
            (client.clone(), key.clone(), token(), ttl())
                .prop_map(|(client, key, token, ttl)| Op::Commit {
                    client,
                    key,
                    token,
                    ttl,
                })
                .boxed(),
        );
        let roles = prop::collection::vec(0u8..4, KEYS.len());
        choices.push(
            (client, keys, roles, token(), ttl(), lease())
                .prop_map(|(client, keys, roles, token, ttl, lease)| {
                    let (mut release, mut renew, mut remember) = (vec![], vec![], vec![]);
                    for (key, role) in keys.into_iter().zip(roles) {
                        match role {
                            0 => release.push((key, token)),
                            1 => renew.push((key, token)),
                            2 => remember.push((key, Some(token))),
                            _ => remember.push((key, None)),
                        }
                    }
                    Op::Settle {
                        client,
                        release,
                        renew,
                        remember,
                        ttl,
                        lease,
                    }
                })
                .boxed(),
        );
    }
    prop::collection::vec(prop::strategy::Union::new(choices), 1..40)
}

/// A run as Rust source, to paste into a test: `vec![Op::Claim { .. }, ..]`.
pub fn as_rust(ops: &[Op]) -> String {
    let items: Vec<String> = ops
        .iter()
        .map(|op| {
            let text = format!("{op:?}").replace('[', "vec![");
            let text = ["Before", "After", "Resend"]
                .iter()
                .fold(text, |text, fault| {
                    text.replace(
                        &format!("fault: {fault}"),
                        &format!("fault: Fault::{fault}"),
                    )
                });
            format!("Op::{text}")
        })
        .collect();
    format!("vec![{}]", items.join(", "))
}

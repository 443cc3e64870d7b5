//! The Lua scripts (compare-and-delete, owner-only renewal, the fenced commit),
//! sent by SHA1 and loaded on a server's first `NOSCRIPT`.

use std::sync::OnceLock;

use redis::{Cmd, RedisResult, Value};

use super::conn::Conn;

/// Lua: `read(k)`, a key's value (false: none), where a key of another type
/// reads as `{wrongtype = true}` instead of failing the script with
/// WRONGTYPE (a server error failed the whole pipeline of a batch's commits,
/// on a Redis Cluster too); any other error of the `GET` (an ACL's NOPERM) is
/// raised by `redis.call` (`error(v)` lost its text before Redis 7: a review). And `foreign(v, mode)`: is `v` a value
/// this dialect does not write? Mode `n` (ours: `d` or `c:...`) or `p` (PHP's:
/// `1` or `2`).
pub(super) const FOREIGN: &str = "local function read(k) \
      local v = redis.pcall('GET', k) \
      if type(v) == 'table' then \
        if string.find(v.err, 'WRONGTYPE', 1, true) then return {wrongtype = true} end \
        return redis.call('GET', k) end \
      return v end \
    local function foreign(v, mode) \
      if type(v) == 'table' then return true end \
      if not v then return false end \
      if mode == 'p' then return v ~= '1' and v ~= '2' end \
      local p = string.sub(v, 1, 2) \
      return v ~= 'd' and p ~= 'd:' and p ~= 'c:' end ";

/// Compare-and-delete, so only the claim's owner can release it (a claim re-taken
/// after its lease ran out belongs to someone else). In PHP's format the value is
/// `1` for every claimer: PHP's own release script, unable to tell them apart.
/// A key of another type is not ours: 0.
pub(super) fn release_script() -> String {
    format!(
        "{FOREIGN} if read(KEYS[1]) == ARGV[1] then \
         return redis.call('DEL', KEYS[1]) end return 0"
    )
}

/// Extends a claim only for its owner: 1 if renewed, 0 if the claim is gone, -1
/// if the key holds a value of another format. ARGV: claim value, lease ms, mode.
pub(super) fn renew_script() -> String {
    format!(
        "{FOREIGN} local v = read(KEYS[1]) \
         if v == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end \
         if foreign(v, ARGV[3]) then return -1 end return 0"
    )
}

/// The fenced commit, in one atomic step per key. ARGV: our claim value, the
/// value our commit leaves, the TTL in ms (0: none), mode, the value a lost
/// commit leaves (plain remembered). The owner's claim becomes
/// remembered (1); in our format so does a key already remembered by this very
/// commit (`d:<token>`: the commit was sent again after its reply was lost). A
/// lost claim (0): the key is remembered only if it is gone (expired or
/// forgotten); a remembered key or another consumer's claim is left. A value of
/// another format: -1, nothing written.
pub(super) fn commit_script() -> String {
    format!(
        "{FOREIGN} local v = read(KEYS[1]) \
         if foreign(v, ARGV[4]) then return -1 end \
         local ours = v == ARGV[1] or (ARGV[4] == 'n' and v == ARGV[2]) \
         if ours or v == false then \
           local done = ARGV[5] if ours then done = ARGV[2] end \
           if ARGV[3] == '0' then redis.call('SET', KEYS[1], done) \
           else redis.call('SET', KEYS[1], done, 'PX', ARGV[3]) end \
           if ours then return 1 end \
         end return 0"
    )
}

/// A key's value and the milliseconds its expiry has left (`PTTL`: -1 none),
/// read at one instant; nil for no key.
pub(super) const PEEK: &str = "local v = redis.call('GET', KEYS[1]) \
      if not v then return false end return {v, redis.call('PTTL', KEYS[1])}";

/// A script, sent by its SHA1 (`EVALSHA`: a batch of 100 commits is a few KB,
/// not the script text 100 times); loaded on a server's first `NOSCRIPT`.
pub(super) struct Lua {
    pub(super) code: String,
    pub(super) sha: String,
}

impl Lua {
    pub(super) fn new(code: String) -> Self {
        let sha = redis::Script::new(&code).get_hash().to_owned();
        Lua { code, sha }
    }
}

/// The scripts, made once.
pub(super) struct Scripts {
    pub(super) release: Lua,
    pub(super) peek: Lua,
    pub(super) renew: Lua,
    pub(super) commit: Lua,
}

pub(super) fn scripts() -> &'static Scripts {
    static SCRIPTS: OnceLock<Scripts> = OnceLock::new();
    SCRIPTS.get_or_init(|| Scripts {
        release: Lua::new(release_script()),
        peek: Lua::new(PEEK.to_owned()),
        renew: Lua::new(renew_script()),
        commit: Lua::new(commit_script()),
    })
}

/// `SCRIPT LOAD` of every script (on a cluster the client sends it to every node).
pub(super) fn load_scripts(conn: &mut Conn) -> RedisResult<()> {
    let s = scripts();
    for lua in [&s.release, &s.peek, &s.renew, &s.commit] {
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(&lua.code);
        let _: Value = match conn {
            Conn::Single(c) => load.query(c)?,
            Conn::Cluster(c) => load.query(&mut **c)?,
        };
    }
    Ok(())
}

pub(super) fn eval(script: &Lua, key: Vec<u8>) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(&script.sha).arg(1).arg(key);
    cmd
}

//! Cloudflare Workers adapter (issue #4).

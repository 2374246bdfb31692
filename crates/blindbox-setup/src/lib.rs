//! BlindBox setup (paper §3.3): how the middlebox obtains `AES_k(r)` for each rule chunk `r`
//! signed by the rule generator, without learning `k`, while the endpoints never learn `r`.

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

//! Writes Intel's SGX and TDX sample quotes (from the `dcap-qvl` package), encoded as our DCAP
//! evidence (collateral as JSON and compressed), into the directory given: the seed corpus of the `attest_evidence` fuzz target.
//!
//! `cargo run -p mbx-attest --example dcap_seed -- fuzz/corpus/attest_evidence`

#[path = "../tests/common/mod.rs"]
mod common;

use mbx_attest::{Collateral, DcapEvidence, Evidence};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args_os()
        .nth(1)
        .ok_or("usage: dcap_seed <corpus directory>")?;
    let dir = std::path::Path::new(&dir);
    std::fs::create_dir_all(dir)?;
    for (name, s) in [("sgx", common::sgx()), ("tdx", common::tdx())] {
        let compressed = Collateral::deflate(&s.collateral_json)?;
        let plain = Evidence::Dcap(DcapEvidence::new(s.quote.clone(), s.collateral_json)?);
        let deflated = Evidence::Dcap(DcapEvidence::with_collateral(s.quote, compressed)?);
        std::fs::write(dir.join(format!("dcap-{name}")), plain.to_bytes())?;
        std::fs::write(
            dir.join(format!("dcap-{name}-deflated")),
            deflated.to_bytes(),
        )?;
    }
    println!(
        "wrote dcap-sgx, dcap-tdx and their -deflated forms to {}",
        dir.display()
    );
    Ok(())
}

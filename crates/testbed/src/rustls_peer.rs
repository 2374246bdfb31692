//! rustls as a legacy TLS peer in process: a server that answers every request with its head
//! ([`crate::http_echo::answer_with_head`]) and a client that sends one request and reads to
//! the end. With OpenSSL (`s_server`, `s_client`, nginx, curl) and GnuTLS (`gnutls-serv`,
//! `gnutls-cli`) it makes a third TLS stack the middleboxes meet, with its own record sizes,
//! ticket habits and strictness.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::peers::TlsVersion;
use crate::pki::PkiFiles;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn versions(version: Option<TlsVersion>) -> Vec<&'static rustls::SupportedProtocolVersion> {
    match version {
        None => vec![&rustls::version::TLS13, &rustls::version::TLS12],
        Some(TlsVersion::Tls12) => vec![&rustls::version::TLS12],
        Some(TlsVersion::Tls13) => vec![&rustls::version::TLS13],
    }
}

/// Starts a rustls server with `files`' chain and key on `127.0.0.1` (an ephemeral port),
/// allowing `version` only if given; each connection is answered with its request's head,
/// then close_notify, on its own task until the runtime ends.
pub async fn rustls_echo_server(
    files: &PkiFiles,
    version: Option<TlsVersion>,
) -> Result<SocketAddr, Error> {
    let chain = CertificateDer::pem_file_iter(&files.chain)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(&files.key)?;
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&versions(version))?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    crate::http_echo::answer_with_head(tls).await;
                }
            });
        }
    });
    Ok(addr)
}

/// What a rustls client got: the negotiated version and everything the server sent until it
/// closed.
#[derive(Debug)]
pub struct RustlsFetch {
    pub version: Option<rustls::ProtocolVersion>,
    pub response: Vec<u8>,
}

/// Connects a rustls client to `addr` for `server_name` (SNI and the certificate's name,
/// which must chain to the root in `ca`), allowing `version` only if given, sends `request`
/// and reads until the server ends the stream.
pub async fn rustls_fetch(
    addr: SocketAddr,
    server_name: &str,
    ca: &Path,
    version: Option<TlsVersion>,
    request: &[u8],
) -> Result<RustlsFetch, Error> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca)? {
        roots.add(cert?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&versions(version))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(server_name.to_owned())?;
    let mut tls = connector.connect(name, tcp).await?;
    let version = tls.get_ref().1.protocol_version();
    tls.write_all(request).await?;
    let mut response = Vec::new();
    tls.read_to_end(&mut response).await?;
    Ok(RustlsFetch { version, response })
}

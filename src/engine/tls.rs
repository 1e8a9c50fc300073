//! The `ssl_*` settings of a `rediss://` URL made into the redis crate's TLS settings. The PEM
//! files are read here, once, when a client is made (a file that changes later is not re-read).

use redis::{ClientTlsConfig, ConnectionAddr, ConnectionInfo, TlsCertificates};

use super::error::{Error, Result};
use crate::protocol::url::{self, Endpoint, TlsOptions};

/// Parses a URL of any accepted scheme, with its `ssl_*` settings applied.
pub fn parse_endpoint(url_text: &str) -> Result<Endpoint> {
    let (plain, options) = url::split_tls(url_text).map_err(Error::Invalid)?;
    let endpoint = url::parse_endpoint(&plain).map_err(Error::Invalid)?;
    match endpoint {
        Endpoint::Direct(info) if !options.is_default() => {
            Ok(Endpoint::Direct(apply(info, &options)?))
        }
        other => Ok(other),
    }
}

fn read_pem(arg: &str, path: &str, what: &str) -> Result<Vec<u8>> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::Invalid(format!("{arg}: cannot read '{path}': {e}")))?;
    if !bytes.windows(what.len()).any(|w| w == what.as_bytes()) {
        return Err(Error::Invalid(format!(
            "{arg}: '{path}' holds no PEM block '{what}'"
        )));
    }
    Ok(bytes)
}

/// The connection settings with the CA, client certificate and checks of `options`.
fn apply(info: ConnectionInfo, options: &TlsOptions) -> Result<ConnectionInfo> {
    let root_cert = options
        .ca_certs
        .as_deref()
        .map(|path| read_pem("ssl_ca_certs", path, "-----BEGIN CERTIFICATE-----"))
        .transpose()?;
    let client_tls = match options.certfile.as_deref() {
        Some(cert) => {
            // As in Python's ssl: without a key file, the key is read from the certificate file.
            let key = options.keyfile.as_deref().unwrap_or(cert);
            let key_arg = if options.keyfile.is_some() {
                "ssl_keyfile"
            } else {
                "ssl_certfile"
            };
            Some(ClientTlsConfig {
                client_cert: read_pem("ssl_certfile", cert, "-----BEGIN CERTIFICATE-----")?,
                client_key: read_pem(key_arg, key, "PRIVATE KEY-----")?,
            })
        }
        None => None,
    };
    let info = if root_cert.is_some() || client_tls.is_some() {
        redis::Client::build_with_tls(
            info,
            TlsCertificates {
                client_tls,
                root_cert,
            },
        )
        .map_err(|e| Error::Invalid(format!("ssl: {e}")))?
        .get_connection_info()
        .clone()
    } else {
        info
    };
    let mut addr = match info.addr().clone() {
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure,
            tls_params,
        } => ConnectionAddr::TcpTls {
            host,
            port,
            // ssl_cert_reqs=none: no check of the server's certificate at all.
            insecure: insecure || !options.verify_peer,
            tls_params,
        },
        other => other,
    };
    if !options.check_hostname {
        addr.set_danger_accept_invalid_hostnames(true);
    }
    Ok(info.set_addr(addr))
}

//! The `ssl_*` settings of a `rediss://` URL made into the redis crate's TLS settings. The PEM
//! files are read here, once, when a client is made (a file that changes later is not re-read).

use redis::{ClientTlsConfig, ConnectionAddr, ConnectionInfo, TlsCertificates};

use super::error::{Error, Result};
use crate::protocol::url::{self, Endpoint, TlsOptions};

/// Parses a URL of any accepted scheme, with its `ssl_*` settings applied (a Sentinel URL's
/// are kept with it and read by `Sentinel::new`, when the Client is made, for the connections
/// it makes later).
pub fn parse_endpoint(url_text: &str) -> Result<Endpoint> {
    let (plain, options) = url::split_tls(url_text).map_err(Error::Invalid)?;
    let endpoint = url::parse_endpoint(&plain).map_err(Error::Invalid)?;
    if options.is_default() {
        return Ok(endpoint);
    }
    match endpoint {
        Endpoint::Direct(info) => Ok(Endpoint::Direct(Tls::read(&options)?.apply(info)?)),
        Endpoint::Sentinel(mut sentinel) => {
            sentinel.tls_options = options;
            Ok(Endpoint::Sentinel(sentinel))
        }
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

/// The `ssl_*` settings of a URL with their files read: applied to one server's connection
/// settings, or to each sentinel's and master's of a Sentinel URL.
pub struct Tls {
    certificates: TlsCertificates,
    verify_peer: bool,
    check_hostname: bool,
}

impl Tls {
    /// Reads the CA and client certificate files `options` names.
    pub fn read(options: &TlsOptions) -> Result<Self> {
        let root_cert = options
            .ca_certs
            .as_deref()
            .map(|path| read_pem("ssl_ca_certs", path, "-----BEGIN CERTIFICATE-----"))
            .transpose()?;
        let client_tls = match options.certfile.as_deref() {
            Some(cert) => {
                // As in Python's ssl: without a key file, the key is read from the certificate
                // file.
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
        Ok(Tls {
            certificates: TlsCertificates {
                client_tls,
                root_cert,
            },
            verify_peer: options.verify_peer,
            check_hostname: options.check_hostname,
        })
    }

    /// The CA and client certificate, for the redis crate's cluster client (which makes the
    /// connections to the nodes it learns of itself).
    pub fn certificates(&self) -> TlsCertificates {
        let TlsCertificates {
            client_tls,
            root_cert,
        } = &self.certificates;
        TlsCertificates {
            client_tls: client_tls.as_ref().map(|c| ClientTlsConfig {
                client_cert: c.client_cert.clone(),
                client_key: c.client_key.clone(),
            }),
            root_cert: root_cert.clone(),
        }
    }

    /// Whether the server's certificate must name the host connected to (`ssl_check_hostname`).
    pub fn check_hostname(&self) -> bool {
        self.check_hostname
    }

    /// `info` (a TLS address) with the CA, client certificate and checks of these settings.
    pub fn apply(&self, info: ConnectionInfo) -> Result<ConnectionInfo> {
        let TlsCertificates {
            client_tls,
            root_cert,
        } = &self.certificates;
        let info = if root_cert.is_some() || client_tls.is_some() {
            redis::Client::build_with_tls(info, self.certificates())
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
                insecure: insecure || !self.verify_peer,
                tls_params,
            },
            other => other,
        };
        if !self.check_hostname {
            addr.set_danger_accept_invalid_hostnames(true);
        }
        Ok(info.set_addr(addr))
    }
}

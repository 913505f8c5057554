//! The one table of stable result codes shared by gRPC, HTTP and the Python client.
//!
//! Codes are the seed contract (`docs/python-api.md`, "Error codes"); they travel as plain integers
//! (`ret`) so a client can return them unchanged. Each layer keeps its own error enum and maps it to a
//! [`Code`] in one exhaustive `match`.

use std::fmt;

/// A stable result code. The numeric values are part of the public API and never change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    Ok,
    InternalError,
    InvalidParams,
    RpcFail,
    RpcTimeout,
    ConductorUnavailable,
    ServiceNotFound,
    /// A request without a valid token while the service requires one (`auth_token`).
    Unauthorized,
}

impl Code {
    /// Every code, for tables and tests.
    pub const ALL: [Code; 8] = [
        Code::Ok,
        Code::InternalError,
        Code::InvalidParams,
        Code::RpcFail,
        Code::RpcTimeout,
        Code::ConductorUnavailable,
        Code::ServiceNotFound,
        Code::Unauthorized,
    ];

    /// The integer the seed API returns for this code.
    pub const fn value(self) -> i32 {
        match self {
            Code::Ok => 0,
            Code::InternalError => -1,
            Code::InvalidParams => -600,
            Code::RpcFail => -900,
            Code::RpcTimeout => -901,
            Code::ConductorUnavailable => -2000,
            Code::ServiceNotFound => -2001,
            // Not in the seed's table, which predates authentication: the next free value of
            // the Conductor's own range.
            Code::Unauthorized => -2002,
        }
    }

    /// The constant name exported by `mooncake.conductor`.
    pub const fn name(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::InternalError => "INTERNAL_ERROR",
            Code::InvalidParams => "INVALID_PARAMS",
            Code::RpcFail => "RPC_FAIL",
            Code::RpcTimeout => "RPC_TIMEOUT",
            Code::ConductorUnavailable => "CONDUCTOR_UNAVAILABLE",
            Code::ServiceNotFound => "SERVICE_NOT_FOUND",
            Code::Unauthorized => "UNAUTHORIZED",
        }
    }

    /// The HTTP status a failed request with this code answers with.
    pub const fn http_status(self) -> u16 {
        match self {
            Code::Ok => 200,
            Code::InvalidParams => 400,
            Code::Unauthorized => 401,
            Code::ServiceNotFound => 404,
            Code::ConductorUnavailable => 503,
            Code::RpcTimeout => 504,
            Code::InternalError | Code::RpcFail => 500,
        }
    }

    pub fn from_value(value: i32) -> Option<Code> {
        Code::ALL.into_iter().find(|c| c.value() == value)
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.value())
    }
}

/// An operation failure: a stable code, the offending field when there is one, and a message for
/// humans. Transports render it (gRPC `ret` + message, HTTP 4xx/5xx body).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct OpError {
    pub code: Code,
    /// The request field the error is about (HTTP reports it as `field`).
    pub field: Option<String>,
    /// Machine-readable reason (`missing`, `invalid_type`, `invalid_value`, `out_of_range`, ...).
    pub reason: &'static str,
    pub message: String,
    /// The position of the offending element within `field` (HTTP reports it as `index`).
    pub index: Option<u64>,
}

impl OpError {
    /// The same error about element `index` of its field.
    pub fn at(mut self, index: usize) -> Self {
        self.index = Some(index as u64);
        self
    }

    pub fn invalid(
        field: impl Into<String>,
        reason: &'static str,
        message: impl Into<String>,
    ) -> Self {
        OpError {
            code: Code::InvalidParams,
            field: Some(field.into()),
            reason,
            message: message.into(),
            index: None,
        }
    }

    /// An invalid request that no single field is to blame for (for example a conflicting registration).
    pub fn invalid_registration(message: impl Into<String>) -> Self {
        OpError {
            code: Code::InvalidParams,
            field: None,
            reason: "invalid_registration",
            message: message.into(),
            index: None,
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        OpError {
            code: Code::ServiceNotFound,
            field: None,
            reason: "not_found",
            message: message.into(),
            index: None,
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        OpError {
            code: Code::InternalError,
            field: None,
            reason: "internal",
            message: message.into(),
            index: None,
        }
    }

    /// A missing or wrong token. The message never echoes what the caller sent.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        OpError {
            code: Code::Unauthorized,
            field: None,
            reason: "unauthorized",
            message: message.into(),
            index: None,
        }
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        OpError {
            code: Code::ConductorUnavailable,
            field: None,
            reason: "unavailable",
            message: message.into(),
            index: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_values_are_stable() {
        let table: Vec<(&str, i32)> = Code::ALL.iter().map(|c| (c.name(), c.value())).collect();
        assert_eq!(
            table,
            vec![
                ("OK", 0),
                ("INTERNAL_ERROR", -1),
                ("INVALID_PARAMS", -600),
                ("RPC_FAIL", -900),
                ("RPC_TIMEOUT", -901),
                ("CONDUCTOR_UNAVAILABLE", -2000),
                ("SERVICE_NOT_FOUND", -2001),
                ("UNAUTHORIZED", -2002),
            ]
        );
    }

    #[test]
    fn values_round_trip() {
        for code in Code::ALL {
            assert_eq!(Code::from_value(code.value()), Some(code));
        }
        assert_eq!(Code::from_value(1), None);
    }
}

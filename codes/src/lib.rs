//! The stable result codes of the Mooncake Conductor, shared by the service (gRPC, HTTP) and the
//! Python client: one table, so that the two can never disagree on a value or a name.
//!
//! No dependencies, so that the Python client can use it without linking the service.

#![no_std]

use core::fmt;

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

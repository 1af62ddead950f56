//! Why an agent operation (launch, takeover, stop, reap) did not happen, with what the
//! control plane's errors carry (`{code, message, field?, rejection?}`, over REST or in a gRPC
//! refusal's metadata), so a relayed
//! answer reads the same as one from a control node: the agent API sends it as the client's
//! `ErrorBody`.

use squadron_client::ErrorBody;
use squadron_core::error_code::ErrorCode;
use squadron_core::Rejection;

use crate::control_link::CallError;
use crate::error::WorkerError;

#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub(crate) struct AgentError {
    pub(crate) code: ErrorCode,
    pub(crate) message: String,
    pub(crate) field: Option<String>,
    /// The control plane's rejection, passed through unchanged.
    pub(crate) rejection: Option<Rejection>,
}

impl From<AgentError> for ErrorBody {
    fn from(e: AgentError) -> Self {
        ErrorBody {
            code: e.code,
            message: e.message,
            field: e.field,
            rejection: e.rejection,
        }
    }
}

impl AgentError {
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        AgentError {
            code,
            message: message.into(),
            field: None,
            rejection: None,
        }
    }

    pub(crate) fn invalid(field: &str, message: impl Into<String>) -> Self {
        AgentError {
            field: Some(field.to_owned()),
            ..AgentError::new(ErrorCode::InvalidArgument, message)
        }
    }

    pub(crate) fn precondition(message: impl Into<String>) -> Self {
        AgentError::new(ErrorCode::FailedPrecondition, message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        AgentError::new(ErrorCode::NotFound, message)
    }

    pub(crate) fn http_status(&self) -> u16 {
        self.code.http_status()
    }

    /// Prefixes the message with what was being done.
    pub(crate) fn context(mut self, doing: &str) -> Self {
        self.message = format!("{doing}: {}", self.message);
        self
    }
}

impl From<CallError> for AgentError {
    fn from(e: CallError) -> Self {
        match e {
            CallError::Refused(body) => AgentError {
                code: body.code,
                message: body.message,
                field: body.field,
                rejection: body.rejection,
            },
            CallError::Unanswered(m) => {
                AgentError::new(ErrorCode::Unavailable, format!("control plane: {m}"))
            }
        }
    }
}

impl From<WorkerError> for AgentError {
    fn from(e: WorkerError) -> Self {
        match e {
            WorkerError::Invalid { field, message } => AgentError::invalid(&field, message),
            WorkerError::Control(m) => AgentError::new(ErrorCode::Unavailable, m),
            other => AgentError::new(ErrorCode::Internal, other.to_string()),
        }
    }
}

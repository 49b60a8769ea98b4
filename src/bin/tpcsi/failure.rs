//! Why a command failed, and so its exit status: 1 for bad input, 3 for
//! a socket out of reach, 4 for no answer in time, 5 for `probe` finding a
//! device class other than the default one down, 10 + the gRPC code for
//! the driver's error; and the line (or JSON) that says so.

use std::time::Duration;

use thinpool_csi::metrics::code_name;
use tonic::Status;

use crate::output::ErrorOut;

/// Why a command failed, and so its exit status.
#[derive(Debug)]
pub enum Failure {
    /// Bad input or config, found before the call it was for (a
    /// `--class` the driver does not serve is found by GetPluginInfo): 1.
    Local(String),
    /// The socket could not be reached: 3.
    Connect(String),
    /// No answer within `--timeout`: 4.
    Timeout(Duration),
    /// `probe`: a device class other than the default one takes no new
    /// volume, while the default one does: 5.
    ClassDown(String),
    /// The driver answered an error: 10 + its gRPC code.
    Grpc(Status),
}

pub const EXIT_LOCAL: u8 = 1;
pub const EXIT_CONNECT: u8 = 3;
pub const EXIT_TIMEOUT: u8 = 4;
pub const EXIT_CLASS_DOWN: u8 = 5;
pub const EXIT_GRPC_BASE: u8 = 10;

impl Failure {
    pub fn exit_status(&self) -> u8 {
        match self {
            Failure::Local(_) => EXIT_LOCAL,
            Failure::Connect(_) => EXIT_CONNECT,
            Failure::Timeout(_) => EXIT_TIMEOUT,
            Failure::ClassDown(_) => EXIT_CLASS_DOWN,
            Failure::Grpc(s) => EXIT_GRPC_BASE + s.code() as u8,
        }
    }

    pub fn to_out(&self) -> ErrorOut {
        let (code, code_number, message) = match self {
            Failure::Local(m) | Failure::Connect(m) | Failure::ClassDown(m) => {
                (None, None, m.clone())
            }
            Failure::Timeout(t) => (
                None,
                None,
                format!(
                    "no answer within {} s; the driver goes on with what it started \
                     (run the command again to see where it stands)",
                    t.as_secs()
                ),
            ),
            Failure::Grpc(s) => (
                Some(code_name(s.code()).to_string()),
                Some(s.code() as i32),
                s.message().to_string(),
            ),
        };
        ErrorOut {
            code,
            code_number,
            message,
            exit_status: self.exit_status(),
        }
    }

    /// The line on stderr: `error: NOT_FOUND (5): volume … does not exist`.
    pub fn line(&self) -> String {
        let e = self.to_out();
        match (e.code, e.code_number) {
            (Some(c), Some(n)) => format!("error: {c} ({n}): {}", e.message),
            _ => format!("error: {}", e.message),
        }
    }
}

impl From<Status> for Failure {
    fn from(s: Status) -> Failure {
        Failure::Grpc(s)
    }
}

pub type Result<T> = std::result::Result<T, Failure>;

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn exit_status_and_error_line_carry_the_grpc_code() {
        let f = Failure::Grpc(Status::not_found("volume csi-x does not exist"));
        assert_eq!(f.exit_status(), 15);
        assert_eq!(
            f.line(),
            "error: NOT_FOUND (5): volume csi-x does not exist"
        );
        assert_eq!(
            serde_json::to_value(f.to_out()).unwrap(),
            serde_json::json!({
                "code": "NOT_FOUND", "code_number": 5,
                "message": "volume csi-x does not exist", "exit_status": 15
            })
        );
        assert_eq!(Failure::Grpc(Status::unauthenticated("")).exit_status(), 26);
        assert_eq!(Failure::Connect("x".into()).exit_status(), 3);
        assert_eq!(Failure::Local("x".into()).line(), "error: x");
        assert_eq!(Failure::Local("x".into()).exit_status(), 1);
        assert_eq!(Failure::ClassDown("x".into()).exit_status(), 5);
    }

    #[test]
    fn code_names_are_grpc_names() {
        for n in 0..=16 {
            let c = Code::from_i32(n);
            let name = code_name(c);
            // tonic's Debug spelling, in upper snake case.
            let debug = format!("{c:?}");
            let mut snake = String::new();
            for (i, ch) in debug.chars().enumerate() {
                if ch.is_uppercase() && i > 0 {
                    snake.push('_');
                }
                snake.push(ch.to_ascii_uppercase());
            }
            assert_eq!(name, snake);
        }
    }
}

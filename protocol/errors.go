package protocol

import (
	"errors"
	"fmt"
	"net/http"
)

// ErrorType classifies a tool error. It is sent as error.type in HTTP and
// NATS answers and decides the HTTP status.
type ErrorType string

// Error types. Everything a tool raises before running anything is one of
// these (DESIGN.md §7); what happens to a command or session is a normal
// result instead.
const (
	ErrInvalidRequest    ErrorType = "invalid_request"        // 400: bad JSON, wrong types, unknown parameters
	ErrSecurityViolation ErrorType = "security_violation"     // 400: blocked env keys and the like
	ErrHostNotAllowed    ErrorType = "host_not_allowed"       // 400: host resolution refused the call
	ErrDenied            ErrorType = "denied"                 // 400: exec denied by policy
	ErrUnauthorized      ErrorType = "unauthorized"           // 401
	ErrForbidden         ErrorType = "forbidden"              // 403: an operator action with the tool token, a foreign Origin
	ErrNotFound          ErrorType = "not_found"              // 404: unknown or denied tool, unknown route
	ErrMethodNotAllowed  ErrorType = "method_not_allowed"     // 405
	ErrConflict          ErrorType = "conflict"               // 409
	ErrTooLarge          ErrorType = "payload_too_large"      // 413
	ErrUnsupportedMedia  ErrorType = "unsupported_media_type" // 415: a POST or PUT body that is not JSON
	ErrMisdirected       ErrorType = "misdirected_request"    // 421: a Host the gateway does not answer to
	ErrRateLimited       ErrorType = "rate_limited"           // 429
	ErrUnavailable       ErrorType = "unavailable"            // 503: node unreachable, shutting down (retryable)
	ErrInternal          ErrorType = "internal"               // 500
)

// HTTPStatus maps an error type to its HTTP status code.
func (t ErrorType) HTTPStatus() int {
	switch t {
	case ErrInvalidRequest, ErrSecurityViolation, ErrHostNotAllowed, ErrDenied:
		return http.StatusBadRequest
	case ErrUnauthorized:
		return http.StatusUnauthorized
	case ErrForbidden:
		return http.StatusForbidden
	case ErrNotFound:
		return http.StatusNotFound
	case ErrMethodNotAllowed:
		return http.StatusMethodNotAllowed
	case ErrConflict, ErrApprovalRequired:
		return http.StatusConflict
	case ErrTooLarge:
		return http.StatusRequestEntityTooLarge
	case ErrUnsupportedMedia:
		return http.StatusUnsupportedMediaType
	case ErrMisdirected:
		return http.StatusMisdirectedRequest
	case ErrRateLimited:
		return http.StatusTooManyRequests
	case ErrUnavailable:
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// Error is an error raised by a tool before it ran anything. Its Message is
// the exact text an OpenClaw agent would see.
type Error struct {
	Type    ErrorType `json:"type"`
	Message string    `json:"message"`
	// Retryable marks errors where the same call may succeed later
	// (node unreachable); clients may retry them.
	Retryable bool `json:"retryable,omitempty"`
}

func (e *Error) Error() string { return e.Message }

// Errorf returns an *Error of the given type.
func Errorf(t ErrorType, format string, args ...any) *Error {
	return &Error{Type: t, Message: fmt.Sprintf(format, args...)}
}

// AsError returns err as an *Error; anything else becomes ErrInternal with
// the error's text, and nil stays nil.
func AsError(err error) *Error {
	if err == nil {
		return nil
	}
	var pe *Error
	if errors.As(err, &pe) {
		return pe
	}
	return &Error{Type: ErrInternal, Message: err.Error()}
}

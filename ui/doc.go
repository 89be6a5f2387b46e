// Package ui holds execmesh's operator surfaces: the web control page and
// the terminal progress helpers of the CLI.
//
// Handler serves the control page at /ui/: a token prompt (the token is
// kept in the tab's sessionStorage and sent as a bearer token; a loopback
// gateway without a tool token is tried first, and GET /v1/whoami says
// whether the token is the operator's), the node registry with the
// exec node binding, the process sessions (of every sessionKey for the
// operator, of a chosen one otherwise; filtered and paged in the page)
// with their output, a kill button and an input box, a terminal on a
// session, the pending exec approvals with allow-once, allow-always and
// deny, and a form to run a command, in the terminal if asked. The page
// is plain HTML, CSS and JavaScript with no build step, embedded with
// xterm.js (assets/xterm: the npm releases' files, pinned and checked by
// scripts/vendor-xterm.sh); nothing is fetched from elsewhere. It talks to the gateway's HTTP API only (GET
// /v1/whoami, POST /tools/invoke, GET /v1/approvals, POST
// /v1/approvals/<id>, GET /v1/nodes, PUT /v1/config/exec-node, GET
// /v1/sessions/<sessionKey>/<id>/stream, GET /v1/sessions and GET
// /v1/admin/blockers for the sessionKeys, and the attach WebSockets), from
// its own origin: the gateway refuses other origins.
//
// The tool API lists sessions per sessionKey (process list). To the
// operator the page shows every key by default: GET /v1/sessions (the
// operator's) names the keys that hold sessions, the page reads the
// process list of each, at most 8 at a time, and merges them newest
// first, with a sessionKey column that the filter matches too; each
// row's terminal, output, input, kill and remove act under that row's
// key. "Show" lists the one key in the key box instead. With the tool
// token the page shows one key at a time and suggests the keys the
// gateway shows it elsewhere: those of running gateway sessions and
// pending approvals.
//
// The terminal (xterm.js with its canvas renderer, so that the page's
// Content-Security-Policy needs no inline style) first writes the
// session's retained log (process log), then attaches over GET
// /v1/sessions/<id>/attach, read-write, or read-only when another client
// holds the input (the handshake fails with 409, which a browser cannot
// read: a read-only attach that then succeeds says so). Keys go as stdin
// bytes (Ctrl-C is 0x03 on a PTY; on a pipe Ctrl-C and Ctrl-D are SIGINT
// and end of input), the grid's size as resize, and the panel shows the
// exit status, or how the socket closed. "Run in terminal" starts the
// command on a PTY over GET /v1/exec/attach with keepOnDetach, so closing
// the panel detaches and the session runs on. The token travels as the
// WebSocket subprotocol execmesh.bearer.<token> (browsers cannot set
// Authorization on a WebSocket).
//
// Deciding approvals and changing the binding need the operator token
// (DESIGN.md §3.4). The page gets it only from the user, who pastes it
// (on the gateway's machine: the file operator.token in the state dir,
// mode 0600); it is never in a URL (browser history, logs, the Referer)
// nor served by the gateway, so neither another local user nor another
// web page can obtain it. With the tool token, or none, those actions
// answer 403 and the page says to sign in as the operator.
//
// The page only reads what agents rely on: a session's live output comes
// from the gateway's session stream (server-sent events read with fetch,
// since EventSource cannot send the token), which the gateway builds with
// process log, not poll, so the page neither drains output an agent has
// not read yet nor acknowledges its exit notices. It does not open the
// events stream, which would consume the exit notices.
//
// FollowSession and Spinner are the CLI's live progress: following a
// background session's output until it exits, and a spinner with the
// elapsed time while a call waits.
package ui

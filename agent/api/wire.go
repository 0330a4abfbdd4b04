package api

// The request and response bodies are the wire package's (agent/api/wire),
// so a client (cmd/shinkenctl) speaks the API without linking the server.

import "github.com/shinken-agent/shinken/agent/api/wire"

type (
	RequestBody       = wire.RequestBody
	RequestResult     = wire.RequestResult
	RevokeBody        = wire.RevokeBody
	AttenuateBody     = wire.AttenuateBody
	ApproveBody       = wire.ApproveBody
	DecideBody        = wire.DecideBody
	PolicyBody        = wire.PolicyBody
	PolicyResult      = wire.PolicyResult
	CreateSessionBody = wire.CreateSessionBody
	SessionView       = wire.SessionView
	RunRequest        = wire.RunRequest
	RunResult         = wire.RunResult
	Record            = wire.Record
	Error             = wire.Error
)

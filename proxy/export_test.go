package proxy

// IdempotentRunID is the run id of attempt n of an Idempotency-Key.
var IdempotentRunID = idempotentRunID

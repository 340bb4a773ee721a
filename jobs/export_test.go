package jobs

// CheckTxOpen exposes checkTxOpen to the external tests.
var CheckTxOpen = checkTxOpen

package redisconn

// replyReasons are the reasons of Reason that come from an error reply of
// the store; the others are failures to get an answer.
var replyReasons = map[string]bool{"noperm": true, "noauth": true, "loading": true, "readonly": true, "oom": true,
	"clusterdown": true, "tryagain": true, "moved": true, "busy": true, "error_reply": true}

// IsReply says whether err is store trouble the store answered (an error
// reply: NOPERM, READONLY, OOM…): it is reachable and refused the keys
// concerned. Only trouble without an answer (a timeout, a refused or reset
// connection) is evidence that the store is down.
func IsReply(err error) bool { return replyReasons[Reason(err)] }

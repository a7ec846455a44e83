package proxy

import (
	"fmt"
	"net/url"
	"strings"
)

// answerShapingQuery are Google's system parameters that reshape an answer, read from the query
// string (with or without a leading '$') by Google's front end on every API it serves, the
// Gemini OpenAI-compatible endpoint among them, and forwarded with the rest of the query: a
// field mask ("fields") can leave usage out of the answer, charged then at the prompt's estimate
// alone; "alt=proto" answers in protobuf and "callback" in JSONP, neither of which is JSON or an
// event stream: no answer the gateway can meter, charged nothing while the provider billed it.
var answerShapingQuery = []string{"fields", "alt", "callback"}

// modelQuery is the query parameter LiteLLM's proxy reads a model from on its chat, completions
// and embeddings routes (a query parameter of their handlers, there for its Azure-style
// deployment paths), in place of the body's: the router ran, and billed, the model the query
// named, while the gateway priced, bounded and charged the call as the body's model (an answer
// naming a model without a price is billed at the price asked for).
const modelQuery = "model"

// checkQuery refuses a query string carrying one of answerShapingQuery, or modelQuery, its
// name compared unescaped and with case folded. A ';' separates parameters as '&' does: servers
// that split on it (as Go's own did before 1.17) would read `?x=1;fields=choices` as a field
// mask.
func checkQuery(rawQuery string) *apiError {
	for pair := range strings.FieldsFuncSeq(rawQuery, isQuerySeparator) { // no slice built per request
		name, _, _ := strings.Cut(pair, "=")
		if unescaped, err := url.QueryUnescape(name); err == nil {
			name = unescaped
		}
		name = strings.TrimPrefix(strings.TrimSpace(name), "$")
		if strings.EqualFold(name, modelQuery) {
			return errBadRequest("unsupported_parameter",
				"The query parameter 'model' names a model a router in front of the provider runs in place of the body's, billed at its own rates while this gateway prices the body's; name the model in the body alone.")
		}
		for _, p := range answerShapingQuery {
			if strings.EqualFold(name, p) {
				return errBadRequest("unsupported_parameter", fmt.Sprintf(
					"The query parameter '%s' reshapes the provider's answer so that its usage cannot be metered; send the request without it.", p))
			}
		}
	}
	return nil
}

// isQuerySeparator reports whether r separates a query's parameters for some server.
func isQuerySeparator(r rune) bool { return r == '&' || r == ';' }

package fakellm

import (
	"encoding/base64"
	"encoding/binary"
	"math"
	"strconv"

	"github.com/tidwall/gjson"
)

// defaultDims keeps vectors short: nobody measures their quality, and the
// benchmark should measure the gateway, not JSON encoding of floats.
const defaultDims = 8

// embeddings answers /v1/embeddings: one vector per input, usage with prompt
// tokens only (embeddings have no output to bill).
type embeddings struct {
	gen
	inputs int
	dims   int
	base64 bool // the OpenAI Python SDK asks for base64 by default
	seed   uint64
}

func newEmbeddings(g gen, root gjson.Result, seed uint64) *embeddings {
	x := &embeddings{gen: g, dims: defaultDims, seed: seed, inputs: 1}
	if in := root.Get("input"); in.IsArray() {
		// An array of numbers is one tokenized input; anything else is a list.
		items := in.Array()
		if len(items) == 0 || items[0].Type != gjson.Number {
			x.inputs = len(items)
		}
	}
	if d := root.Get("dimensions"); d.Type == gjson.Number && d.Num >= 1 && d.Num <= 4096 {
		x.dims = int(d.Num)
	}
	x.base64 = root.Get("encoding_format").Str == "base64"
	return x
}

func (x *embeddings) whole(b []byte) []byte {
	b = append(b, `{"object":"list","data":[`...)
	state := x.seed
	var raw []byte
	for i := range x.inputs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"object":"embedding","index":`...)
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, `,"embedding":`...)
		if x.base64 {
			raw = raw[:0]
		} else {
			b = append(b, '[')
		}
		for j := range x.dims {
			// A fixed LCG from the body's hash: deterministic, and no two
			// inputs of a request get the same vector.
			state = state*6364136223846793005 + 1442695040888963407
			v := float32(int32(state>>32)) / (1 << 31)
			if x.base64 {
				raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(v))
				continue
			}
			if j > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendFloat(b, float64(v), 'g', -1, 32)
		}
		if x.base64 {
			b = append(b, '"')
			b = base64.StdEncoding.AppendEncode(b, raw)
			b = append(b, '"')
		} else {
			b = append(b, ']')
		}
		b = append(b, '}')
	}
	b = append(b, `],"model":`...)
	b = append(b, x.model...)
	if x.usage != usageOff {
		b = append(b, `,"usage":{"prompt_tokens":`...)
		b = appendInt(b, x.prompt)
		b = append(b, `,"total_tokens":`...)
		b = appendInt(b, x.prompt)
		b = append(b, '}')
	}
	return append(b, "}\n"...)
}

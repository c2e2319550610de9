package bgjob

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// checkOutbuf writes chunks to an outbuf and checks it against a model
// that keeps every byte: memory stays within the caps, the held ranges
// hold exactly the model's bytes, and a finished job's Read walks them.
func checkOutbuf(t *testing.T, headCap, tailCap int, chunks [][]byte) {
	t.Helper()
	b := newOutbuf(headCap, tailCap)
	var model []byte
	for _, c := range chunks {
		b.write(c)
		model = append(model, c...)
		if cap(b.head) > headCap || cap(b.ring) > tailCap {
			t.Fatalf("caps %d/%d exceed %d/%d", cap(b.head), cap(b.ring), headCap, tailCap)
		}
	}
	if b.total != int64(len(model)) {
		t.Fatalf("total %d; want %d", b.total, len(model))
	}
	headEnd, tailBegin := b.held()
	if headEnd > int64(headCap) || b.total-tailBegin > int64(tailCap) || headEnd > tailBegin {
		t.Fatalf("held [0,%d) [%d,%d) with caps %d/%d", headEnd, tailBegin, b.total, headCap, tailCap)
	}
	if got := b.appendRange(nil, 0, headEnd); !bytes.Equal(got, model[:headEnd]) {
		t.Fatalf("head differs from the model")
	}
	if got := b.appendRange(nil, tailBegin, b.total); !bytes.Equal(got, model[tailBegin:]) {
		t.Fatalf("tail differs from the model")
	}
	v := b.view()
	if v.omitted() != tailBegin-headEnd {
		t.Fatalf("omitted %d; want %d", v.omitted(), tailBegin-headEnd)
	}
	// Without an Admitter the final text maps byte for byte: walk it.
	pieces := []rawPiece{{start: 0, end: int64(len(v.head)), bytes: v.head}}
	if v.omitted() > 0 {
		pieces = append(pieces, rawPiece{start: v.tailBegin, end: v.total, bytes: v.tail})
	}
	f := &final{out: Output{Text: v.text(), Total: v.total}}
	f.segs = mapSegments(f.out.Text, v.separator(), pieces)
	var off, skipped int64
	for {
		c, err := f.read(off, 1+rand.IntN(5000))
		if err != nil {
			t.Fatalf("read(%d): %v", off, err)
		}
		if c.Offset != off+c.Skipped || !bytes.Equal([]byte(c.Data), model[c.Offset:c.Next]) {
			t.Fatalf("read(%d) = [%d,%d) skipped %d, data differs from the model", off, c.Offset, c.Next, c.Skipped)
		}
		skipped += c.Skipped
		if c.Done {
			break
		}
		if c.Next <= off {
			t.Fatalf("read(%d) made no progress", off)
		}
		off = c.Next
	}
	if skipped != v.omitted() {
		t.Fatalf("skipped %d; want %d", skipped, v.omitted())
	}
}

func randomChunks(rng *rand.Rand, n int) [][]byte {
	var chunks [][]byte
	for range n {
		c := make([]byte, rng.IntN(3000))
		for i := range c {
			c[i] = "abc\n\x00\xff"[rng.IntN(6)]
		}
		chunks = append(chunks, c)
	}
	return chunks
}

func TestOutbufAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		checkOutbuf(t, 1+rng.IntN(6000), 1+rng.IntN(9000), randomChunks(rng, rng.IntN(40)))
	}
}

func FuzzOutbuf(f *testing.F) {
	f.Add(uint16(10), uint16(20), []byte("hello\nworld\n"), uint8(3))
	f.Add(uint16(1), uint16(1), []byte("\n\n\n"), uint8(1))
	f.Add(uint16(4096), uint16(8192), bytes.Repeat([]byte("line of text\n"), 2000), uint8(7))
	f.Fuzz(func(t *testing.T, head, tail uint16, data []byte, split uint8) {
		if head == 0 || tail == 0 {
			return
		}
		var chunks [][]byte
		step := int(split) + 1
		for i := 0; i < len(data); i += step {
			chunks = append(chunks, data[i:min(i+step, len(data))])
		}
		checkOutbuf(t, int(head), int(tail), chunks)
	})
}

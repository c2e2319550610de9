package bgjob

import (
	"strings"
	"unicode/utf8"
)

// A TTY job's Output.Text is its stream as plain text: terminal escape
// sequences removed, and the carriage returns, backspaces and line
// erasures of progress bars and overstrike applied to each line as a
// terminal would, so that what a model reads is what a person saw scroll
// by. (Full-screen programs, which move the cursor around, read better
// through Registry.Screen.)
//
// stripper is a streaming state machine: it gives the same text however
// the stream is cut into writes, so a sequence or a UTF-8 rune split
// between two reads is handled. It recognises CSI (ESC [ ... final),
// OSC (ESC ] ... BEL or ST), the string sequences DCS, SOS, PM and APC
// (ESC P, X, ^, _ ... ST; CAN or SUB aborts them), ESC with intermediate
// bytes (ESC ( B), and the two-byte ESC sequences. An ESC inside a
// string sequence that is not the start of ST begins a new sequence, as
// terminals do. C1 controls as single bytes (0x80-0x9f) are not taken
// for controls: in a UTF-8 stream they are parts of runes.
//
// Text policy: "\r\n" becomes "\n"; a carriage return moves back to the
// line's start, and what follows overwrites the line (a progress bar
// leaves its last state); a backspace moves back one rune (so man's
// overstrike "_\bx" leaves "x"); CSI K erases to the end of the line
// (CSI 2 K the whole line); TAB and every printable rune are kept, other
// control bytes dropped. Bytes that are not UTF-8 are kept as they are.
type stripper struct {
	out  strings.Builder
	line []rune // the current line, not yet ended by "\n"
	col  int    // the cursor's column in line
	st   stripState
	// param holds the first parameter of a CSI sequence, for EL; -1
	// before a digit, -2 once it cannot be EL's.
	param int
	// partial holds the first bytes of a UTF-8 rune cut by the end of a
	// write.
	partial []byte
}

type stripState uint8

const (
	stGround    stripState = iota
	stEsc                  // after ESC
	stEscInter             // ESC and intermediate bytes: until a final byte
	stCSI                  // ESC [: parameters and intermediates until a final byte
	stOSC                  // ESC ]: until BEL or ST
	stString               // ESC P, X, ^ or _: until ST
	stStringEsc            // ESC inside OSC or a string: "\" ends it
)

// rawByte marks a byte that is not part of a UTF-8 rune: it is kept in a
// line as this code point plus the byte, and written back as the byte.
// The range is of lone surrogates, which no valid UTF-8 decodes to.
const rawByte = 0xDC00

// stripText returns s as a TTY job's text (see stripper). Text with no
// escape or control byte other than "\n" and TAB comes back as it is.
func stripText(s []byte) string {
	if plain(s) {
		return string(s)
	}
	var st stripper
	st.write(s)
	return st.text()
}

// plain reports whether s needs no stripping.
func plain(s []byte) bool {
	for _, c := range s {
		if c < 0x20 && c != '\n' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// write feeds p to the stripper.
func (s *stripper) write(p []byte) {
	// Complete a rune cut by the end of the last write, a byte at a time.
	for len(s.partial) > 0 && len(p) > 0 {
		s.partial = append(s.partial, p[0])
		p = p[1:]
		if !utf8.FullRune(s.partial) {
			continue
		}
		b := s.partial
		s.partial = nil
		if r, size := utf8.DecodeRune(b); r != utf8.RuneError || size > 1 {
			s.put(r)
			continue
		}
		// Not a rune after all: its first byte is kept raw, and the
		// rest goes through the machine again.
		s.put(rawByte + rune(b[0]))
		s.write(b[1:])
	}
	for i := 0; i < len(p); {
		c := p[i]
		switch s.st {
		case stGround:
			switch {
			case c == 0x1b:
				s.st = stEsc
			case c == '\n':
				s.endLine()
			case c == '\r':
				s.col = 0
			case c == '\b':
				if s.col > 0 {
					s.col--
				}
			case c == '\t':
				s.put('\t')
			case c < 0x20 || c == 0x7f:
				// Other controls (BEL, SO, SI, NUL, DEL...) show nothing.
			case c < utf8.RuneSelf:
				s.put(rune(c))
			default:
				if !utf8.FullRune(p[i:]) {
					s.partial = append([]byte(nil), p[i:]...)
					return
				}
				r, size := utf8.DecodeRune(p[i:])
				if r == utf8.RuneError && size <= 1 {
					s.put(rawByte + rune(c))
				} else {
					s.put(r)
					i += size
					continue
				}
			}
		case stEsc:
			switch {
			case c == '[':
				s.st, s.param = stCSI, -1
			case c == ']':
				s.st = stOSC
			case c == 'P' || c == 'X' || c == '^' || c == '_':
				s.st = stString
			case c >= 0x20 && c <= 0x2f:
				s.st = stEscInter
			case c == 0x1b:
				// ESC ESC: the first one is dropped, the second starts anew.
			case c == 0x18 || c == 0x1a:
				s.st = stGround
			case c < 0x20:
				// A control inside a sequence is executed, as terminals do.
				s.st = stGround
				s.control(c)
				s.st = stEsc
			default:
				s.st = stGround // a two-byte sequence (ESC 7, ESC M, ESC =...)
			}
		case stEscInter:
			switch {
			case c == 0x1b:
				s.st = stEsc
			case c == 0x18 || c == 0x1a:
				s.st = stGround
			case c >= 0x30 && c <= 0x7e:
				s.st = stGround
			}
		case stCSI:
			switch {
			case c == 0x1b:
				s.st = stEsc
			case c == 0x18 || c == 0x1a:
				s.st = stGround
			case c >= '0' && c <= '9':
				if s.param == -1 {
					s.param = 0
				}
				if s.param >= 0 && s.param < 1000 {
					s.param = s.param*10 + int(c-'0')
				}
			case c >= 0x40 && c <= 0x7e:
				s.st = stGround
				if c == 'K' && s.param != -2 {
					s.eraseLine(max(s.param, 0))
				}
			case c >= 0x20 && c <= 0x3f:
				// ; ? > = and intermediates: not a plain EL any more.
				s.param = -2
			case c < 0x20:
				s.st = stGround
				s.control(c)
				s.st = stCSI
			}
		case stOSC, stString:
			switch {
			case c == 0x1b:
				s.st = stStringEsc
			case c == 0x07 && s.st == stOSC:
				s.st = stGround
			case c == 0x18 || c == 0x1a:
				s.st = stGround
			}
		case stStringEsc:
			if c == '\\' {
				s.st = stGround
			} else {
				// Not ST: the ESC starts a new sequence.
				s.st = stEsc
				continue
			}
		}
		i++
	}
}

// control executes a control byte met inside a sequence.
func (s *stripper) control(c byte) {
	switch c {
	case '\n':
		s.endLine()
	case '\r':
		s.col = 0
	case '\b':
		if s.col > 0 {
			s.col--
		}
	}
}

// put writes r at the cursor, overwriting the line from there.
func (s *stripper) put(r rune) {
	if s.col < len(s.line) {
		s.line[s.col] = r
	} else {
		s.line = append(s.line, r)
	}
	s.col++
}

// eraseLine is EL: 0 erases from the cursor to the end, 1 from the start
// to the cursor, 2 the whole line (the cursor stays).
func (s *stripper) eraseLine(mode int) {
	switch mode {
	case 0:
		if s.col < len(s.line) {
			s.line = s.line[:s.col]
		}
	case 1:
		for i := 0; i <= s.col && i < len(s.line); i++ {
			s.line[i] = ' '
		}
	case 2:
		s.line = s.line[:0]
		for range s.col {
			s.line = append(s.line, ' ')
		}
	}
}

// endLine ends the current line.
func (s *stripper) endLine() {
	s.flushLine()
	s.out.WriteByte('\n')
}

func (s *stripper) flushLine() {
	for _, r := range s.line {
		if r >= rawByte+0x80 && r <= rawByte+0xff {
			s.out.WriteByte(byte(r - rawByte))
		} else {
			s.out.WriteRune(r)
		}
	}
	s.line, s.col = s.line[:0], 0
}

// text returns the text so far: the ended lines and the current one, and
// the bytes of a rune still cut short. The stripper must not be written
// to afterwards.
func (s *stripper) text() string {
	s.flushLine()
	s.out.Write(s.partial)
	return s.out.String()
}

package approvals

import "fmt"

// awkProgramRisk reads an awk program and returns why it is not a pure text
// filter: system() and pipes (`print | "cmd"`, `"cmd" | getline`, gawk's
// `|&`) run commands, `print > file` and `>>` write files, and gawk's @
// (@load, @include, indirect calls such as @f() where f holds "system")
// loads code or calls a function by name. "" means the program only reads
// and prints.
//
// The reader is a tokenizer, not a full parser, and fails closed:
//
//   - A "/" starts a regular expression only where a division cannot
//     stand (at the start, after an operator, "(", ",", "{", ";", a
//     newline, or a keyword such as print). Everywhere else it is a
//     division, so text that might be a regular expression is read as
//     code, which can only add refusals.
//   - A regular expression whose bracket expression contains "/" or a
//     newline is refused: awks disagree on where such an expression ends.
//   - ">" is an output redirection when it stands in a print or printf
//     statement outside parentheses (POSIX grammar: `print $1 > 2` writes
//     to the file "2", `print ($1 > 2)` compares); elsewhere it compares.
//   - Unterminated strings and regular expressions, and characters awk
//     does not know, are refused.
func awkProgramRisk(prog string) string {
	var (
		operand    bool // the previous token ended an operand: "/" divides
		inPrint    bool // inside a print/printf statement
		printDepth int  // parenthesis depth at the print keyword
		depth      int
	)
	s := prog
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\r':
			i++
		case c == '\\' && i+1 < len(s) && s[i+1] == '\n':
			i += 2 // line continuation
		case c == '\n' || c == ';':
			inPrint, operand = false, false
			i++
		case c == '#':
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case c == '"':
			j := i + 1
			for ; j < len(s) && s[j] != '"'; j++ {
				if s[j] == '\\' {
					j++
				} else if s[j] == '\n' {
					return "awk: newline in a string"
				}
			}
			if j >= len(s) {
				return "awk: unterminated string"
			}
			i, operand = j+1, true
		case c == '/' && !operand:
			j, why := awkRegexEnd(s, i+1)
			if why != "" {
				return why
			}
			i, operand = j, true
		case c == '/':
			i++
			if i < len(s) && s[i] == '=' {
				i++
			}
			operand = false
		case isAwkIdentStart(c):
			j := i
			for j < len(s) && isAwkIdent(s[j]) {
				j++
			}
			word := s[i:j]
			i = j
			switch word {
			case "system":
				return "awk system(): runs a command"
			case "print", "printf":
				inPrint, printDepth, operand = true, depth, false
			case "return", "case", "do", "else", "in", "exit", "BEGIN", "END", "BEGINFILE",
				"ENDFILE", "if", "while", "for", "function", "func", "delete", "next", "nextfile",
				"break", "continue", "default":
				operand = false
			default:
				operand = true // variables, builtin functions, getline
			}
		case c >= '0' && c <= '9' || c == '.' && i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9':
			for i < len(s) && (isAwkIdent(s[i]) || s[i] == '.') {
				i++
			}
			operand = true
		case c == '|':
			if i+1 < len(s) && s[i+1] == '|' {
				i += 2
				operand = false
				continue
			}
			return "awk |: pipes to or from a command"
		case c == '>':
			if inPrint && depth == printDepth && !(i+1 < len(s) && s[i+1] == '=') {
				return "awk print >: writes a file"
			}
			i++
			if i < len(s) && (s[i] == '=' || s[i] == '>') {
				i++
			}
			operand = false
		case c == '@':
			return "awk @: loads code or calls a function by name"
		case c == '(':
			depth++
			i++
			operand = false
		case c == ')':
			depth--
			i++
			operand = true
		case c == ']':
			i++
			operand = true
		case c == '+' || c == '-':
			if i+1 < len(s) && s[i+1] == c {
				i += 2 // ++ and -- end an operand when postfix; "/" then divides
				operand = true
				continue
			}
			i++
			operand = false
		case c == '{' || c == '}':
			inPrint, operand = false, false
			i++
		case c == '$' || c == '[' || c == ',' || c == '=' || c == '*' || c == '%' || c == '^' ||
			c == '!' || c == '~' || c == '?' || c == ':' || c == '&' || c == '<':
			i++
			operand = false
		default:
			return fmt.Sprintf("awk: unexpected character %q", string(c))
		}
	}
	return ""
}

// awkRegexEnd returns the index after the "/" that ends the regular
// expression starting at i.
func awkRegexEnd(s string, i int) (int, string) {
	for i < len(s) {
		switch s[i] {
		case '\\':
			i += 2
			continue
		case '\n':
			return 0, "awk: newline in a regular expression"
		case '/':
			return i + 1, ""
		case '[':
			i++
			if i < len(s) && s[i] == '^' {
				i++
			}
			if i < len(s) && s[i] == ']' {
				i++
			}
			for i < len(s) && s[i] != ']' {
				if s[i] == '/' || s[i] == '\n' {
					return 0, "awk: bracket expression containing / or a newline"
				}
				if s[i] == '[' && i+1 < len(s) && (s[i+1] == ':' || s[i+1] == '.' || s[i+1] == '=') {
					end := i + 2
					for end+1 < len(s) && !(s[end] == s[i+1] && s[end+1] == ']') {
						if s[end] == '/' || s[end] == '\n' {
							return 0, "awk: bracket expression containing / or a newline"
						}
						end++
					}
					i = end + 2
					continue
				}
				if s[i] == '\\' {
					i++
				}
				i++
			}
			if i >= len(s) {
				return 0, "awk: unterminated bracket expression"
			}
			i++
			continue
		}
		i++
	}
	return 0, "awk: unterminated regular expression"
}

func isAwkIdentStart(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func isAwkIdent(c byte) bool { return isAwkIdentStart(c) || c >= '0' && c <= '9' }

//go:build ignore

// gen writes the secret parts of the Redactor's corpus: shell/*.txt from
// templates/*.txt, and bare/*.txt, one file per vendor family. Every
// token is fake, drawn from a seeded generator in the shape that the
// public scanners' fixtures show (see README.md); where a family has a
// checksum (GitHub, npm) the token carries a valid one. Run it from the
// repository's root:
//
//	go run testdata/redact/gen.go
//
// Annotations: ⟦...⟧ marks bytes that must be masked, ⟪...⟫ bytes that
// must be left as they are (placeholders). In templates, {kind} is
// replaced by a fresh token of that kind, {kind#n} by the n-th token of
// that kind (so one secret can appear twice), and {b64:TEXT:b64} by the
// base64 of TEXT (after its own {kind} are replaced).
package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

const (
	upper  = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	lower  = "abcdefghijklmnopqrstuvwxyz"
	digits = "0123456789"
	alnum  = digits + upper + lower
	hexl   = "0123456789abcdef"
	b64    = upper + lower + digits + "+/"
	b64url = upper + lower + digits + "-_"
)

var rnd = rand.New(rand.NewPCG(22, 2026))

func pick(set string, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = set[rnd.IntN(len(set))]
	}
	return string(b)
}

func digitsN(lo, hi int) string { return pick("123456789", 1) + pick(digits, lo-1+rnd.IntN(hi-lo+1)) }

// base62 of a CRC32, left-padded to 6 characters: the checksum of
// GitHub's and npm's tokens.
func crcSuffix(body string) string {
	c := crc32.ChecksumIEEE([]byte(body))
	const dict = digits + upper + lower
	s := make([]byte, 6)
	for i := 5; i >= 0; i-- {
		s[i] = dict[c%62]
		c /= 62
	}
	return string(s)
}

func checksummed(prefix string) string {
	body := pick(alnum, 30)
	return prefix + body + crcSuffix(body)
}

func b64raw(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func jwt(claims map[string]any, alg string, sigLen int) string {
	h, _ := json.Marshal(map[string]string{"alg": alg, "typ": "JWT"})
	c, _ := json.Marshal(claims)
	return b64raw(string(h)) + "." + b64raw(string(c)) + "." + pick(b64url, sigLen)
}

var kinds = map[string]func() string{
	"ghp":     func() string { return checksummed("ghp_") },
	"gho":     func() string { return checksummed("gho_") },
	"ghu":     func() string { return checksummed("ghu_") },
	"ghs":     func() string { return checksummed("ghs_") },
	"ghr":     func() string { return checksummed("ghr_") },
	"ghpat":   func() string { return "github_pat_11" + pick(upper+digits, 20) + "_" + pick(alnum, 59) },
	"npm":     func() string { return checksummed("npm_") },
	"akia":    func() string { return "AKIA" + pick(upper+"234567", 16) },
	"asia":    func() string { return "ASIA" + pick(upper+"234567", 16) },
	"awssec":  func() string { return pick(alnum+"+/", 40) },
	"awssess": func() string { return "IQoJb3JpZ2luX2VjE" + pick(b64, 300) + "==" },
	"xoxb":    func() string { return "xoxb-" + digitsN(12, 13) + "-" + digitsN(12, 13) + "-" + pick(alnum, 24) },
	"xoxp": func() string {
		return "xoxp-" + digitsN(11, 12) + "-" + digitsN(11, 12) + "-" + digitsN(11, 12) + "-" + pick(hexl, 32)
	},
	"xapp": func() string {
		return "xapp-1-A" + pick(upper+digits, 10) + "-" + digitsN(13, 13) + "-" + pick(hexl, 64)
	},
	"xoxe":    func() string { return "xoxe-1-" + pick(alnum, 146) },
	"xoxecfg": func() string { return "xoxe.xoxp-1-" + pick(alnum, 163) },
	"slackhook": func() string {
		return "https://hooks.slack.com/services/T" + pick(upper+digits, 8) + "/B" + pick(upper+digits, 10) + "/" + pick(alnum, 24)
	},
	"openai":    func() string { return "sk-proj-" + pick(b64url, 74) + "T3BlbkFJ" + pick(b64url, 74) },
	"openaisvc": func() string { return "sk-svcacct-" + pick(b64url, 58) + "T3BlbkFJ" + pick(b64url, 58) },
	"openaiold": func() string { return "sk-" + pick(alnum, 20) + "T3BlbkFJ" + pick(alnum, 20) },
	"anthropic": func() string { return "sk-ant-api03-" + pick(b64url, 93) + "AA" },
	"antadmin":  func() string { return "sk-ant-admin01-" + pick(b64url, 93) + "AA" },
	"glpat":     func() string { return "glpat-" + pick(alnum+"_-", 20) },
	"glpatr": func() string {
		return "glpat-" + pick(alnum+"_-", 36) + "." + pick(digits+lower, 2) + pick(digits+lower, 7)
	},
	"glrt":        func() string { return "glrt-" + pick(alnum+"_-", 20) },
	"gldt":        func() string { return "gldt-" + pick(alnum+"_-", 20) },
	"glptt":       func() string { return "glptt-" + pick(hexl, 40) },
	"glft":        func() string { return "glft-" + pick(alnum+"_-", 20) },
	"glcbt":       func() string { return "glcbt-" + pick(alnum, 2) + "_" + pick(alnum+"_-", 20) },
	"glsoat":      func() string { return "glsoat-" + pick(alnum+"_-", 20) },
	"glrrt":       func() string { return "GR1348941" + pick(alnum+"_-", 20) },
	"pypi":        func() string { return "pypi-AgEIcHlwaS5vcmc" + pick(b64url, 150) },
	"sendgrid":    func() string { return "SG." + pick(b64url, 22) + "." + pick(b64url, 43) },
	"hf":          func() string { return "hf_" + pick(upper+lower, 34) },
	"hforg":       func() string { return "api_org_" + pick(upper+lower, 34) },
	"sklive":      func() string { return "sk_live_51" + pick(alnum, 97) },
	"sktest":      func() string { return "sk_test_51" + pick(alnum, 97) },
	"rklive":      func() string { return "rk_live_51" + pick(alnum, 97) },
	"whsec":       func() string { return "whsec_" + pick(alnum, 32) },
	"azad":        func() string { return pick(alnum+"_~.", 3) + pick(digits, 1) + "Q~" + pick(alnum+"_~.-", 34) },
	"aiza":        func() string { return "AIza" + pick(alnum+"_-", 35) },
	"hvs":         func() string { return "hvs." + pick(alnum+"_-", 91) },
	"hvb":         func() string { return "hvb.AAAAAQ" + pick(alnum+"_-", 140) },
	"azstorage":   func() string { return pick(b64, 86) + "==" },
	"azsig":       func() string { return pick(alnum, 10) + "%2B" + pick(alnum, 16) + "%2F" + pick(alnum, 12) + "%3D" },
	"azdevops":    func() string { return pick(lower+digits, 52) },
	"shopify":     func() string { return "shpat_" + pick(hexl, 32) },
	"shopifyss":   func() string { return "shpss_" + pick(hexl, 32) },
	"doctl":       func() string { return "dop_v1_" + pick(hexl, 64) },
	"doppler":     func() string { return "dp.pt." + pick(alnum, 43) },
	"databricks":  func() string { return "dapi" + pick(hexl, 32) },
	"linear":      func() string { return "lin_api_" + pick(alnum, 40) },
	"postman":     func() string { return "PMAK-" + pick(hexl, 24) + "-" + pick(hexl, 34) },
	"twilio":      func() string { return "SK" + pick(hexl, 32) },
	"mailgun":     func() string { return "key-" + pick(hexl, 32) },
	"newrelic":    func() string { return "NRAK-" + pick(upper+digits, 27) },
	"grafana":     func() string { return "glsa_" + pick(alnum, 32) + "_" + pick(hexl, 8) },
	"grafanacl":   func() string { return "glc_eyJ" + pick(b64, 80) + "=" },
	"atlassian":   func() string { return "ATATT3xFfGF0" + pick(b64url, 170) + "=" + pick(upper+digits, 8) },
	"age":         func() string { return "AGE-SECRET-KEY-1" + pick("QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L", 58) },
	"telegram":    func() string { return digitsN(9, 10) + ":AA" + pick(alnum+"_-", 33) },
	"square":      func() string { return "EAAA" + pick(alnum+"_-", 60) },
	"flyio":       func() string { return "fo1_" + pick(b64url, 43) },
	"pulumi":      func() string { return "pul-" + pick(hexl, 40) },
	"dockerhub":   func() string { return "dckr_pat_" + pick(b64url, 27) },
	"terraform":   func() string { return pick(alnum, 14) + ".atlasv1." + pick(alnum+"-_=", 67) },
	"alibaba":     func() string { return "LTAI" + pick(alnum, 20) },
	"googleoa":    func() string { return "ya29.a0" + pick(b64url, 150) },
	"gocspx":      func() string { return "GOCSPX-" + pick(alnum+"_-", 28) },
	"tailscale":   func() string { return "tskey-auth-k" + pick(alnum, 10) + "CNTRL-" + pick(alnum, 33) },
	"supabase":    func() string { return "sbp_" + pick(hexl, 40) },
	"sourcegraph": func() string { return "sgp_" + pick(hexl, 16) + "_" + pick(hexl, 40) },
	"perplexity":  func() string { return "pplx-" + pick(alnum, 48) },
	"rubygems":    func() string { return "rubygems_" + pick(hexl, 48) },
	"nuget":       func() string { return "oy2" + pick(lower+digits, 43) },
	"clojars":     func() string { return "CLOJARS_" + pick(hexl, 60) },
	"planetscale": func() string { return "pscale_tkn_" + pick(alnum+"_.-", 43) },
	"prefect":     func() string { return "pnu_" + pick(alnum, 36) },
	"dynatrace":   func() string { return "dt0c01." + pick(upper+digits, 24) + "." + pick(upper+digits, 64) },
	"openshift":   func() string { return "sha256~" + pick(alnum+"_-", 43) },
	"sentry":      func() string { return "sntrys_eyJpYXQiOjE3" + pick(b64, 120) + "_" + pick(b64, 43) },
	"groq":        func() string { return "gsk_" + pick(alnum, 52) },
	"xai":         func() string { return "xai-" + pick(alnum, 80) },
	"mistral":     func() string { return pick(alnum, 32) },
	"jwt": func() string {
		return jwt(map[string]any{"sub": digitsN(10, 10), "name": "Jane Roe", "iat": 1716239022}, "HS256", 43)
	},
	"jwtsa": func() string {
		return jwt(map[string]any{
			"aud": []string{"https://kubernetes.default.svc.cluster.local"}, "exp": 1767225600, "iat": 1735689600,
			"iss": "https://kubernetes.default.svc.cluster.local",
			"kubernetes.io": map[string]any{"namespace": "default", "pod": map[string]string{"name": "api-7d9f8-x2x", "uid": "1b2c3d4e-5f60-4718-9a0b-1c2d3e4f5a6b"},
				"serviceaccount": map[string]string{"name": "default", "uid": "9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"}},
			"nbf": 1735689600, "sub": "system:serviceaccount:default:default",
		}, "RS256", 342)
	},
	"jwtid": func() string {
		return jwt(map[string]any{"iss": "https://accounts.example.com", "aud": "cli", "email": "dev@example.com", "exp": 1767225600}, "RS256", 342)
	},
	// Passwords and other shapeless values.
	"pw": func() string {
		return pick(upper, 1) + pick(lower, 5) + pick(digits, 2) + pick("!#%^*-_", 1) + pick(alnum, 5)
	},
	"pwat":    func() string { return pick(alnum, 4) + "@" + pick(alnum, 4) + "/" + pick(alnum, 5) },
	"hex32":   func() string { return pick(hexl, 32) },
	"hex40":   func() string { return pick(hexl, 40) },
	"hex64":   func() string { return pick(hexl, 64) },
	"b64_32":  func() string { return base64.StdEncoding.EncodeToString([]byte(pick(alnum, 32))) },
	"alnum24": func() string { return pick(alnum, 24) },
	"alnum40": func() string { return pick(alnum, 40) },
	"uuid": func() string {
		return pick(hexl, 8) + "-" + pick(hexl, 4) + "-4" + pick(hexl, 3) + "-a" + pick(hexl, 3) + "-" + pick(hexl, 12)
	},
	"cookie": func() string { return pick(alnum, 32) },
	"pembody": func() string {
		lines := make([]string, 0, 8)
		lines = append(lines, "MIIEowIBAAKCAQEA"+pick(b64, 48))
		for range 6 {
			lines = append(lines, pick(b64, 64))
		}
		lines = append(lines, pick(b64, 20)+"==")
		return strings.Join(lines, "\n")
	},
}

var (
	placeholder = regexp.MustCompile(`\{([a-z0-9_]+)(?:#([0-9]+))?\}`)
	b64call     = regexp.MustCompile(`(?s)\{b64:(.*?):b64\}`)
)

// expand fills a template. Tokens named {kind#n} are remembered, so the
// same n gives the same token within one file.
func expand(tmpl string) string {
	memo := map[string]string{}
	fill := func(s string) string {
		return placeholder.ReplaceAllStringFunc(s, func(m string) string {
			sub := placeholder.FindStringSubmatch(m)
			gen, ok := kinds[sub[1]]
			if !ok {
				return m
			}
			if sub[2] != "" {
				if v, ok := memo[m]; ok {
					return v
				}
				v := gen()
				memo[m] = v
				return v
			}
			return gen()
		})
	}
	s := b64call.ReplaceAllStringFunc(tmpl, func(m string) string {
		inner := b64call.FindStringSubmatch(m)[1]
		inner = strings.NewReplacer("\\n", "\n", "⟦", "", "⟧", "").Replace(fill(inner))
		return base64.StdEncoding.EncodeToString([]byte(inner))
	})
	return fill(s)
}

// bare contexts: a token printed with nothing around it that names it.
var bareContexts = []string{
	"%s",
	"  %s",
	"Created %s for deploy@example.com",
	"$ cat ~/.config/app/cred\n%s",
	"echo %s | pbcopy",
	"[\"%s\"]",
	"2024-05-02T10:11:12Z INFO using %s (scope: read)",
	"prod    %s    2024-05-01",
}

var bareFamilies = map[string][]string{
	"github":       {"ghp", "gho", "ghu", "ghs", "ghr", "ghpat"},
	"npm":          {"npm"},
	"aws":          {"akia", "asia"},
	"slack":        {"xoxb", "xoxp", "xapp", "xoxe", "xoxecfg", "slackhook"},
	"openai":       {"openai", "openaisvc", "openaiold"},
	"anthropic":    {"anthropic", "antadmin"},
	"gitlab":       {"glpat", "glpatr", "glrt", "gldt", "glptt", "glft", "glcbt", "glsoat", "glrrt"},
	"pypi":         {"pypi"},
	"sendgrid":     {"sendgrid"},
	"huggingface":  {"hf", "hforg"},
	"stripe":       {"sklive", "sktest", "rklive", "whsec"},
	"azure-ad":     {"azad"},
	"gcp":          {"aiza", "googleoa", "gocspx"},
	"vault":        {"hvs", "hvb"},
	"jwt":          {"jwt", "jwtsa", "jwtid"},
	"shopify":      {"shopify", "shopifyss"},
	"digitalocean": {"doctl"},
	"doppler":      {"doppler"},
	"databricks":   {"databricks"},
	"linear":       {"linear"},
	"postman":      {"postman"},
	"twilio":       {"twilio"},
	"mailgun":      {"mailgun"},
	"newrelic":     {"newrelic"},
	"grafana":      {"grafana", "grafanacl"},
	"atlassian":    {"atlassian"},
	"age":          {"age"},
	"telegram":     {"telegram"},
	"square":       {"square"},
	"flyio":        {"flyio"},
	"pulumi":       {"pulumi"},
	"dockerhub":    {"dockerhub"},
	"terraform":    {"terraform"},
	"alibaba":      {"alibaba"},
	"tailscale":    {"tailscale"},
	"supabase":     {"supabase"},
	"sourcegraph":  {"sourcegraph"},
	"perplexity":   {"perplexity"},
	"rubygems":     {"rubygems"},
	"nuget":        {"nuget"},
	"clojars":      {"clojars"},
	"planetscale":  {"planetscale"},
	"prefect":      {"prefect"},
	"dynatrace":    {"dynatrace"},
	"openshift":    {"openshift"},
	"sentry":       {"sentry"},
	"groq":         {"groq"},
	"xai":          {"xai"},
	// No shape of their own: found only next to a key (see shell/).
	"shapeless": {"awssec", "azstorage", "azdevops", "mistral"},
}

func main() {
	dir := filepath.Join("testdata", "redact")
	tmpls, err := filepath.Glob(filepath.Join(dir, "templates", "*.txt"))
	check(err)
	check(os.MkdirAll(filepath.Join(dir, "shell"), 0o755))
	for _, t := range tmpls {
		b, err := os.ReadFile(t)
		check(err)
		check(os.WriteFile(filepath.Join(dir, "shell", filepath.Base(t)), []byte(expand(string(b))), 0o644))
	}
	check(os.MkdirAll(filepath.Join(dir, "bare"), 0o755))
	names := make([]string, 0, len(bareFamilies))
	for n := range bareFamilies {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		var sb strings.Builder
		i := 0
		for _, k := range bareFamilies[n] {
			// At least four tokens a family, each kind in two contexts.
			per := max(2, (4+len(bareFamilies[n])-1)/len(bareFamilies[n]))
			for range per {
				ctx := bareContexts[(i*3+len(n))%len(bareContexts)]
				fmt.Fprintf(&sb, ctx+"\n", "⟦"+kinds[k]()+"⟧")
				i++
			}
		}
		check(os.WriteFile(filepath.Join(dir, "bare", n+".txt"), []byte(sb.String()), 0o644))
	}
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

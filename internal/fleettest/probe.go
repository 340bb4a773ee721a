package fleettest

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// probeTimeout bounds one scrape or probe: a live daemon answers in
// milliseconds; a stopped (SIGSTOP) or exited one never does.
const probeTimeout = 5 * time.Second

// Probe returns the status code and body of GET path on addr (host:port),
// or 0 and the error's text when nothing answered (a stopped or exited
// process). No connection is kept between calls.
func Probe(addr, path string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return 0, err.Error()
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// Metric returns, from one scrape of addr's /metrics, the sum of the
// series of name whose label text contains every fragment (such as
// `outcome="ok"`), and whether the scrape answered. A series that is not
// exported counts 0.
func Metric(addr, name string, fragments ...string) (float64, bool) {
	code, body := Probe(addr, "/metrics")
	if code != http.StatusOK {
		return 0, false
	}
	return sumSeries(body, name, fragments), true
}

func sumSeries(body, name string, fragments []string) float64 {
	sum := 0.0
lines:
	for _, line := range strings.Split(body, "\n") {
		series, value, ok := strings.Cut(line, " ")
		if !ok || (series != name && !strings.HasPrefix(series, name+"{")) {
			continue
		}
		for _, f := range fragments {
			if !strings.Contains(series, f) {
				continue lines
			}
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

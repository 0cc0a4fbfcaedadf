package formation

import (
	"strings"
	"testing"
)

const sampleNodes = `07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004,host-a slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922 [5460-<-292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f]
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30003@31003 myself,master - 0 1426238318243 3 connected 10923-16383 0 [93->-67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1]
6ec23923021cf3ffec47632106199cb7f496ce01 :0@0 master,fail,noaddr - 1426238316232 1426238316232 5 disconnected
824fe116063bc5fcf9f4ffd895bc17aee7731ac3 ::1:30006@31006 slave,fail? 292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 0 1426238317741 6 connected
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 handshake - 0 0 0 connected
`

func TestParseClusterNodes(t *testing.T) {
	t.Parallel()
	view, err := ParseClusterNodes(sampleNodes)
	if err != nil {
		t.Fatal(err)
	}
	if len(view) != 6 {
		t.Fatalf("parsed %d lines, want 6", len(view))
	}
	self, ok := view.Self()
	if !ok || self.ID != "292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f" {
		t.Fatalf("Self = %+v, %v", self, ok)
	}
	if got, want := FormatRanges(self.Slots), "10923-16383,0"; got != want {
		t.Errorf("self slots = %s, want %s", got, want)
	}
	if got := self.Migrating[93]; got != "67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1" {
		t.Errorf("migrating[93] = %q", got)
	}
	if got := self.SlotCount(); got != 16383-10923+1+1 {
		t.Errorf("SlotCount = %d", got)
	}
	m2, _ := view.Node("67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1")
	if m2.Importing[5460] != "292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f" || m2.Addr != "127.0.0.1:30002" || m2.ConfigEpoch != 2 {
		t.Errorf("node 67ed = %+v", m2)
	}
	r, _ := view.Node("07c37dfeb235213a872192d90877d0cd55635b91")
	if !r.IsReplica() || r.MasterID != "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca" || r.Addr != "127.0.0.1:30004" || !r.Connected {
		t.Errorf("replica = %+v", r)
	}
	gone, _ := view.Node("6ec23923021cf3ffec47632106199cb7f496ce01")
	if gone.Addr != "" || !gone.Flags.Has(FlagNoAddr|FlagFail) || !gone.Failing() || gone.Connected {
		t.Errorf("noaddr node = %+v", gone)
	}
	v6, _ := view.Node("824fe116063bc5fcf9f4ffd895bc17aee7731ac3")
	if v6.Addr != "[::1]:30006" || !v6.Flags.Has(FlagPFail) {
		t.Errorf("IPv6 node = %+v (flags %s)", v6, v6.Flags)
	}
	if !view.InHandshake("127.0.0.1:30001") || len(view.AtAddr("127.0.0.1:30001")) != 0 {
		t.Errorf("handshake entry not recognised")
	}
	owners := view.Owners()
	if owners[0] != self.ID || owners[6000] != m2.ID || owners[5460] != "" {
		t.Errorf("owners[0,6000,5460] = %q %q %q", owners[0], owners[6000], owners[5460])
	}
}

func TestParseClusterNodesRejectsGarbage(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		"abc 127.0.0.1:1@2 master - 0 0 1 connected",                                            // short ID
		"07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:1@2 master - 0 0 1",                 // too few fields
		"07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:1@2 master - 0 0 x connected",       // epoch
		"07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:1@2 master - 0 0 1 connected 9-3",   // reversed
		"07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:1@2 master - 0 0 1 connected 16384", // out of range
		"07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:1@2 master - 0 0 1 connected [5]",   // open slot
		"07c37dfeb235213a872192d90877d0cd55635b91 nohost master - 0 0 1 connected",              // address
	} {
		if _, err := ParseClusterNodes(in); err == nil {
			t.Errorf("ParseClusterNodes(%q) succeeded, want an error", in)
		}
	}
	if v, err := ParseClusterNodes(""); err != nil || len(v) != 0 {
		t.Errorf("empty input: %v, %v", v, err)
	}
}

func TestSlotSet(t *testing.T) {
	t.Parallel()
	s := SlotSetOf(SlotRange{0, 3}, SlotRange{10, 10}, SlotRange{16383, 16383})
	if got := FormatRanges(s.Ranges()); got != "0-3,10,16383" {
		t.Errorf("Ranges = %s", got)
	}
	s.Remove(2)
	s.Add(-1)
	s.Add(NumSlots)
	if s.Len() != 5 || s.Has(2) || !s.Has(3) || s.Has(-1) {
		t.Errorf("after edits: %s (len %d)", FormatRanges(s.Ranges()), s.Len())
	}
	var u SlotSet
	u.Union(&s)
	if u.Len() != s.Len() {
		t.Errorf("union len %d, want %d", u.Len(), s.Len())
	}
	if !strings.Contains((FlagMaster|FlagFail).String(), "fail") || Flags(0).String() != "noflags" {
		t.Errorf("Flags.String broken")
	}
}

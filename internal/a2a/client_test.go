package a2a

import (
	"strings"
	"testing"
)

func TestReadEvents(t *testing.T) {
	stream := ": keep-alive\n\ndata: {\"a\":\ndata: 1}\n\nevent: x\nid: 7\ndata:{\"b\":2}\n\ndata: {\"c\":3}"
	var got []string
	if err := readEvents(strings.NewReader(stream), 1024, func(d []byte) error { got = append(got, string(d)); return nil }); err != nil {
		t.Fatal(err)
	}
	want := []string{"{\"a\":\n1}", `{"b":2}`, `{"c":3}`}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("events %q, want %q", got, want)
	}
	big := "data: " + strings.Repeat("x", 2000) + "\n\n"
	if err := readEvents(strings.NewReader(big), 1024, func([]byte) error { return nil }); err == nil || !strings.Contains(err.Error(), "1024 bytes") {
		t.Errorf("an event past the bound: %v", err)
	}
}

func TestDecodeResponse(t *testing.T) {
	var task Task
	err := decodeResponse([]byte(`{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"Task not found: x","data":[{"@type":"`+ErrorInfoType+`","reason":"TASK_NOT_FOUND"}]}}`), &task)
	rpcErr, ok := err.(*Error)
	if !ok || rpcErr.Code != CodeTaskNotFound || rpcErr.Reason() != "TASK_NOT_FOUND" {
		t.Errorf("error %v", err)
	}
	if err := decodeResponse([]byte(`{"jsonrpc":"2.0","id":1,"result":{"id":"t","status":{"state":"TASK_STATE_WORKING"}}}`), &task); err != nil || task.Status.State != TaskStateWorking {
		t.Errorf("task %+v, %v", task, err)
	}
	if err := decodeResponse([]byte(`{"jsonrpc":"2.0","id":1}`), &task); err == nil {
		t.Error("a response without result or error is accepted")
	}
}

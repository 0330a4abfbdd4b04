package dataplane

//go:generate go tool bpf2go -tags linux -target bpfel -cc clang -cflags "-O2 -g -mcpu=v3 -Wall -Werror -I/usr/include/x86_64-linux-gnu" -type shk_handle -type shk_session -type shk_rule -type shk_never4_key -type shk_never6_key -type shk_never_ok_key -type shk_never_ok -type shk_deny -type shk_deny4_key -type shk_deny6_key -type shk_egress_value -type shk_egress4_key -type shk_egress6_key -type shk_flow -type shk_config -type shk_lastconn -type shk_event -type shk_flow_mode shk ../bpf/shinken.bpf.c -- -I../bpf
